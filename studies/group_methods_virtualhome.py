"""GRPO and GiGPO on VirtualHome food preparation beside study C's POAD, NTPO and TWOSOME.

Question: how do the critic-free group-relative methods compare with POAD,
NTPO and TWOSOME on the task of the README's figure, with the same model,
machinery and budget, and the same tuning budget study C's methods had?

Settings (written 2026-11-28, before any cell ran; no setting changes after
a cell has run): `configs/virtualhome.py` (SmolLM2-135M, actor lr 1e-4,
4 threads x 8 steps per update, 1 epoch x 4 minibatches, entropy 0.01,
bfloat16 matmuls), 6,000 env steps, `--config.method=grpo` or `gigpo` with
their defaults: one group of the 4 threads, `mean_std_norm`, epsilon 1e-6,
GiGPO's omega 1 with identical observations as anchor states, no KL
penalty. Their rollouts are episodic: each update plays one episode per
thread from its group's reset seed, cut off at `rollout_length` (8) steps
(the shortest solution takes 6), so an update takes at most 32 env steps.

Step 1, the tuning budget (study B gave TWOSOME four variants beside its
default, 3 seeds each; each group method gets the same), seeds 0-2:
  default; episodes of up to 16 steps (`rollout_length=16`);
  `group.mode=mean_norm`; a KL penalty to the base model
  (`ppo.ref_kl_coef=0.01`, verl-agent's examples); two groups of two
  threads (`group.size=2`).
The rule, study B's: a variant is useful when its final success (mean over
the last 25 % of env steps, then over seeds) is above its method's default
by more than the default's seed std, and the Wilson 95 % interval of its
successful episodes does not fall below the default's. Each method's best
variant is the useful one with the highest final success (a tie within
0.01 goes to the earlier variant in the list above), or the default when
none is useful.

Step 2: each method's best variant on seeds 3-4 as well (5 seeds), set
beside study C's POAD, NTPO and TWOSOME cells (their published reports and
raw logs: docs/results/virtualhome_compare.md), reported as C is: final
success and discounted return with seed std, env steps to the first
success and to a success rate of 0.5 over 16 episodes, successful episodes
with Wilson intervals, and the cost per env step (`bench e2e` against POAD
on the same machine). The fresh seeds 3-4 are given apart, as in C.

Amended 2026-11-29 (twenty-eighth session, after 7 cells had run and an
eighth was running, all of seed 0, and before any cell of seeds 1-2; no setting changed): cells that
are the same computation are not run twice. Until some trajectory earns a
reward, every group-relative advantage is exactly 0, and then GiGPO's update
is GRPO's (`method` selects the advantage function only), `mean_norm` is
`mean_std_norm`, and two groups of two threads play what one group of four
plays (food preparation resets to its one initial state whatever the seed:
envs_py/virtualhome/env.py). So each seed's ten cells fall into three
classes that coincide, bit for bit on one machine, until the first reward:
GRPO's default (with GRPO mean_norm, GRPO groups of 2 and GiGPO's default,
mean_norm and groups of 2), GRPO's 16-step episodes (with GiGPO's), and
GRPO's KL 0.01 (with GiGPO's). Seed 0 runs in full, as the check (the
report's "Same numbers" line names the cells that logged the same value of
every metric in every update). From seed 1 on, each class's GRPO cell runs
first (`--cells=GRPO__seed=1,...` names them), and the other cells of a
class run only when its GRPO cell earned a reward in some update (a lent
GPU, running every cell at once anyway, may run them all); otherwise they are not run, their numbers
are that GRPO cell's, and the page says so. Step 2 alike: a cell of
GiGPO's best variant on seeds 3-4 is not run where GRPO's cell of its class
and seed has run and earned no reward.

Amended 2026-11-29 (twenty-ninth session, while GRPO mean_norm seed 1 ran as
the first cell on a new machine, before its outcome was known; no setting
changed): from that cell on, cells run on a 2-core Intel Xeon (AVX-512 BF16
and AMX) instead of the AMD EPYC of the cells before, and there the same
settings give other numbers from the first update (the bfloat16 matmuls
round differently), so a cell run there is not the computation its class's
GRPO cell made on the EPYC. Classes are therefore kept per machine: where a
class's GRPO cell ran on another machine, the first of its cells to run on
this one takes that cell's place for the class's cells that follow it here
(they run only if it earns a reward; otherwise their numbers are its). On
seed 1, GRPO's mean_norm is that cell for the default class: GRPO's groups
of 2 and GiGPO's default, mean_norm and groups of 2 run only if it earns a
reward. Cells not run on seed 1 of the other two classes (GiGPO's 16-step
episodes and KL 0.01, whose GRPO cells ran on the EPYC without a reward)
keep those cells' numbers, as before.

About 50-80 minutes a cell on a 2-core CPU with native bfloat16 (30 cells
in step 1): a lent GPU runs step 1 in one pass (`bash scripts/gpu_studies.sh
start --study=studies/group_methods_virtualhome.py --workers=30`).

    python -m poad_jax.study --study=studies/group_methods_virtualhome.py              # step 1
    python -m poad_jax.study --study=studies/group_methods_virtualhome.py --report
"""

VARIANTS = (
    ("", {}),
    (", 16-step episodes", {"rollout_length": 16}),
    (", mean_norm", {"group.mode": "mean_norm"}),
    (", KL 0.01", {"ppo.ref_kl_coef": 0.01}),
    (", groups of 2", {"group.size": 2}),
)


# Cells not run by the amendments above (their class's first cell on the machine earned no reward),
# each with that cell: the report reads its logs for them and says so.
NOT_RUN = {
    "GiGPO-16-step-episodes__seed=1": "GRPO-16-step-episodes__seed=1",
    "GiGPO-KL-0.01__seed=1": "GRPO-KL-0.01__seed=1",
    "GiGPO-16-step-episodes__seed=2": "GRPO-16-step-episodes__seed=2",
    "GiGPO-KL-0.01__seed=2": "GRPO-KL-0.01__seed=2",
    **{f"{variant}__seed=2": "GRPO__seed=2"
       for variant in ("GRPO-mean_norm", "GRPO-groups-of-2", "GiGPO", "GiGPO-mean_norm", "GiGPO-groups-of-2")},
}


def get_study():
    variants = [{"label": f"{name}{suffix}", "method": method, **overrides}
                for method, name in (("grpo", "GRPO"), ("gigpo", "GiGPO")) for suffix, overrides in VARIANTS]
    return {
        "name": "group_methods_virtualhome",
        "base_config": "configs/virtualhome.py",
        "fixed": {"total_env_steps": 6000},
        "axes": {"variant": variants},
        "seeds": (0, 1, 2),
        # The cells not run under the amendments, each with the cell whose numbers are its own.
        "same_as": NOT_RUN,
        "report": {"metric": "episode_return", "smoothing": 10, "final_fraction": 0.25, "success_speed": True},
    }
