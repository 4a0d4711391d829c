# Best program of this run: mean ROC AUC 0.8834 on balance_scale (splits 0.9346, 0.9260, 0.8767, 0.8158, 0.8637),
# found at update 1, env step 1.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

def build_model(x_train, y_train):
    model = LogisticRegression()
    model.fit(x_train, y_train)
    return model
