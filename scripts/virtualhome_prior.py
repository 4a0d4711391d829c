"""The embedded model's prior on VirtualHome food preparation, along a shortest successful path.

Prints, at each state of the path, TWOSOME's initial policy: the softmax of
token-normalised log-probs of every offered action (`Sampler.score_actions`).
Used in docs/results.md to explain why SmolLM2 starts below a uniform
choice.  About 30 s on 2 cores.

    .venv/bin/python scripts/virtualhome_prior.py [--model=smollm2-135m-instruct]
"""

import argparse

import numpy as np

from envs_py.virtualhome.env import VirtualHomeEnv
from poad_jax.models.loading import load
from poad_jax.sampling import Sampler

PATH = ("walk to the pancake", "grab the pancake", "walk to the microwave", "open the microwave",
        "put the pancake in the microwave", "close the microwave")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    sampler = Sampler(model)
    env = VirtualHomeEnv("food_preparation")
    observation = env.reset(seed=0)
    for step, action in enumerate(PATH):
        prompt = tokenizer.encode(observation.text)
        candidates = [tokenizer.encode(" " + label) for label in observation.actions]  # raw prompt: a space
        probs = np.asarray(sampler.score_actions(prompt, candidates).probs)
        ranked = sorted(zip(observation.actions, probs), key=lambda pair: -pair[1])
        print(f"| {step} | {action} | " + ", ".join(f"{label} {p:.2f}" for label, p in ranked) + " |")
        observation = env.step(action).observation


if __name__ == "__main__":
    main()
