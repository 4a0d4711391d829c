# Best program of this run: mean ROC AUC 0.8520 on spaceship_titanic (splits 0.8305, 0.8457, 0.8646, 0.8711, 0.8481),
# found at update 12, env step 92.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score

def build_model(x_train, y_train):
    model = RandomForestClassifier()
    model.fit(x_train, y_train)
    return model

# Example usage:
# Assuming x_train and y_train are your dataset
# model = build_model(x_train, y_train)
# roc_auc = roc_auc_score(y_test, model.predict_proba(x_test))
# print(f"ROC AUC: {roc_auc}")
