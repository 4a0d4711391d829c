"""The dataset names (a leaf module: importing it loads nothing else)."""

PAPER_DATASETS = (
    "balance_scale",
    "breast_w",
    "pharyngitis",
    "health_insurance",
    "spaceship_titanic",
    "airlines",
)
SKLEARN_DATASETS = ("sklearn_breast_cancer", "sklearn_wine")
DATASET_NAMES = PAPER_DATASETS + SKLEARN_DATASETS
