# Best program of this run: mean ROC AUC 0.5758 on health_insurance (splits 0.5989, 0.5873, 0.5534, 0.5873, 0.5520),
# found at update 3, env step 20.  Re-score: python -m poad_jax.best_program --workdir <run directory>
import numpy as np
import sklearn
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

def build_model(x_train, y_train):
    """
    Fits a scikit-learn classifier on all of x_train, y_train and returns the fitted classifier.
    
    Parameters:
    x_train (np.ndarray): Features of the training data.
    y_train (np.ndarray): Target labels of the training data.
    
    Returns:
    RandomForestClassifier: The fitted RandomForestClassifier.
    """
    # Split the data into training and testing sets
    x_train, x_test, y_train, y_test = train_test_split(x_train, y_train, test_size=0.2, random_state=42)
    
    # Initialize and train the RandomForestClassifier
    model = RandomForestClassifier(n_estimators=100, random_state=42)
    model.fit(x_train, y_train)
    
    # Return the trained classifier
    return model
