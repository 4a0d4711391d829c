# Best program of this run: mean ROC AUC 0.8834 on balance_scale (splits 0.9346, 0.9260, 0.8767, 0.8158, 0.8637),
# found at update 1, env step 4.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
import numpy as np
from sklearn.linear_model import LogisticRegression

def build_model(x_train, y_train):
    """
    Returns a trained Logistic Regression classifier.
    
    Parameters:
    x_train (np.ndarray): 4 feature columns for the training data.
    y_train (np.ndarray): Integer class labels for the training data.
    
    Returns:
    sklearn.linear_model.LogisticRegression: Trained Logistic Regression classifier.
    """
    model = LogisticRegression()
    model.fit(x_train, y_train)
    return model
