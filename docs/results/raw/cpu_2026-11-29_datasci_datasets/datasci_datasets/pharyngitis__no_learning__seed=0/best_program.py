# Best program of this run: mean ROC AUC 0.6960 on pharyngitis (splits 0.7095, 0.6750, 0.7032, 0.7018, 0.6906),
# found at update 1, env step 1.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

def build_model(x_train, y_train):
    model = LogisticRegression()
    model.fit(x_train, y_train)
    return model
