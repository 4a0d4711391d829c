# Best program of this run: mean ROC AUC 0.8526 on spaceship_titanic (splits 0.8283, 0.8453, 0.8691, 0.8711, 0.8492),
# found at update 20, env step 158.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
import numpy as np
from sklearn.ensemble import RandomForestClassifier

def build_model(x_train, y_train):
    classifier = RandomForestClassifier(n_estimators=1000, random_state=42)
    
    # Fit the classifier on all of x_train, y_train
    classifier.fit(x_train, y_train)
    
    # Return the fitted classifier
    return classifier
