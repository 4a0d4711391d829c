# Best program of this run: mean ROC AUC 0.8834 on balance_scale (splits 0.9346, 0.9260, 0.8767, 0.8158, 0.8637),
# found at update 1, env step 3.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

def build_model(x_train, y_train):
    """
    Fits a scikit-learn classifier on all of x_train and y_train and returns the fitted classifier.
    
    Parameters:
    x_train (np.ndarray): A NumPy float array with 4 feature columns and y_train holds integer class labels.
    y_train (np.ndarray): A NumPy array of class labels (3 classes).
    
    Returns:
    sklearn.linear_model.LogisticRegression: The fitted classifier.
    """
    model = LogisticRegression()
    model.fit(x_train, y_train)
    return model

# Example usage:
# Assuming x_train and y_train are already defined somewhere
# classifier = build_model(x_train, y_train)
# roc_auc = roc_auc_score(y_test, classifier.predict_proba(x_test))
# print(f"ROC AUC: {roc_auc}")
