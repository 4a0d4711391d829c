# Best program of this run: mean ROC AUC 0.9301 on balance_scale (splits 0.9318, 0.9375, 0.9604, 0.9390, 0.8817),
# found at update 21, env step 162.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
import numpy as np
from sklearn.linear_model import LogisticRegression

def build_model(x_train, y_train):
    lr = LogisticRegression(fit_intercept=False)
    lr.fit(x_train[:250], y_train[:250])
    return lr
