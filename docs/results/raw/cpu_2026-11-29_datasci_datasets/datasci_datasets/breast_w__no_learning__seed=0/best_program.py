# Best program of this run: mean ROC AUC 0.9941 on breast_w (splits 0.9962, 0.9924, 0.9855, 1.0000, 0.9964),
# found at update 10, env step 76.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score

def build_model(x_train, y_train):
    """
    Fits a scikit-learn classifier on all of x_train, y_train and returns the fitted classifier.
    """
    model = RandomForestClassifier()
    model.fit(x_train, y_train)
    return model

# Example usage:
# Assuming x_train and y_train are already defined
# model = build_model(x_train, y_train)
# roc_auc = roc_auc_score(y_test, model.predict_proba(x_test))
# print("ROC AUC:", roc_auc)
