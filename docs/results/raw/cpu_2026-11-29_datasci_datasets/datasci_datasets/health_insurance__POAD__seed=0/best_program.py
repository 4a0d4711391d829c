# Best program of this run: mean ROC AUC 0.5829 on health_insurance (splits 0.6060, 0.5785, 0.5855, 0.5781, 0.5663),
# found at update 2, env step 16.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
import numpy as np
from sklearn.ensemble import RandomForestClassifier

def build_model(x_train, y_train):
    """
    Fits a RandomForestClassifier on all features in x_train and returns the fitted classifier.
    
    Parameters:
    x_train (np.ndarray): A 12 feature NumPy array.
    y_train (np.ndarray): An integer class label array.
    
    Returns:
    RandomForestClassifier: The fitted RandomForestClassifier.
    """
    model = RandomForestClassifier()
    model.fit(x_train, y_train)
    return model
