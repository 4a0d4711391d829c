# Best program of this run: mean ROC AUC 0.9934 on breast_w (splits 0.9886, 0.9962, 0.9964, 0.9930, 0.9928),
# found at update 1, env step 5.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

def build_model(x_train, y_train):
    """
    Fits a scikit-learn classifier on all of x_train and y_train.
    
    Args:
    x_train (np.ndarray): A NumPy float array with 9 feature columns and y_train holds integer class labels (2 classes).
    y_train (np.ndarray): An integer array of class labels corresponding to x_train.
    
    Returns:
    sklearn.linear_model.LogisticRegression: The fitted classifier.
    """
    model = LogisticRegression()
    model.fit(x_train, y_train)
    return model

# Example usage:
# Assuming 'x_train' and 'y_train' are already defined
# model = build_model(x_train, y_train)
# predicted_proba = model.predict_proba(x_test)
# roc_auc = roc_auc_score(y_test, predicted_proba)
# print(f"ROC AUC: {roc_auc}")
