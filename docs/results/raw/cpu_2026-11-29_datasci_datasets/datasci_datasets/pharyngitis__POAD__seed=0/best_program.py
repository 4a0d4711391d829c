# Best program of this run: mean ROC AUC 0.6978 on pharyngitis (splits 0.7115, 0.6736, 0.6958, 0.7094, 0.6987),
# found at update 7, env step 50.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline

def build_model(x_train, y_train):
    model = make_pipeline(StandardScaler(), LogisticRegression())
    model.fit(x_train, y_train)
    return model
