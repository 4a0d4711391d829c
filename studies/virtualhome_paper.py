"""POAD, NTPO and TWOSOME on VirtualHome food preparation at the authors' own settings.

Every setting comes from the preset configs/virtualhome_paper.py (one method
per preset argument: the authors' per-method epochs, minibatches, entropy
coefficient and loss chunks; their learning rates 1e-6 / 5e-5; 4 x 32 steps
per update; action-score sampling with word normalisation; their critic head,
KL skip and advantage normalisation).  Three seeds per method, 6,000 env
steps each, seed-major (every method's seed 0 first), so a study interrupted
at any point still compares the methods; re-running the command resumes it.
The report's metric is the paper's: the discounted return (0.95 per env step,
Appendix H), beside the success rate.

    python -m poad_jax.study --study=studies/virtualhome_paper.py
"""


# The paper's Appendix H: discounted return (0.95 per env step) of LLaMA-2-7B agents trained on Food
# Preparation, evaluated on it and its variants (the range over those tasks).
APPENDIX_H = {"label": "paper, Appendix H (LLaMA-2-7B)",
              "values": {"POAD": (0.70, 0.77), "TWOSOME": (0.60, 0.73), "NTPO": (0.57, 0.75)}}


def get_study():
    return {
        "name": "virtualhome_paper",
        "base_config": "configs/virtualhome_paper.py",
        "fixed": {"total_env_steps": 6000},
        "axes": {
            "variant": [
                {"label": "POAD", "config_argument": "poad"},
                {"label": "NTPO", "config_argument": "ntpo"},
                {"label": "TWOSOME", "config_argument": "twosome"},
            ],
        },
        "seeds": (0, 1, 2),
        "report": {"metric": "discounted_return", "smoothing": 10, "final_fraction": 0.25,
                   "reference": APPENDIX_H},
    }
