"""`python -m poad_jax.study --study=studies/<name>.py [--workdir=W] [--workers=N] [--report]`

Runs a grid of training runs ("cells") and aggregates them into learning
curves with seed bands and a table of final results.

A study file defines `get_study()` returning a dict (config fields are
dotted paths, which ConfigDict keys cannot hold):

    name="gamma_w",                           # names the study (and its default workdir)
    base_config="configs/synthetic.py",       # relative to the repository root, the study file or the cwd
    fixed={"total_env_steps": 4800},          # overrides applied to every cell
    axes={                                    # the grid: an ordered mapping axis -> values
        "variant": [                          # a value may be a dict of coupled overrides ...
            {"label": "POAD", "method": "poad"},
            {"label": "NTPO 0.9", "method": "ntpo", "gamma_w": 0.9},
            # "config_argument": "poad" loads base_config as `<file>:poad` (a per-method preset)
        ],
        "env.kwargs.action_length": [2, 4, 8],  # ... or a scalar for the axis's own field
    },
    seeds=(0, 1, 2, 3, 4),
    report={"metric": "episode_return", "threshold": 3.5, "smoothing": 5,   # all optional (spec.ReportOptions)
            "facet": "env.kwargs.action_length", "heatmap": ("variant", "env.kwargs.action_length"),
            "theory": "poad_jax.tools.theory:save_or_take_optimum",
            "steps": {"succeeded": "runnable", "reward": "AUC"},  # a table of succeeded steps per cell
            "best_programs": {"rescore": True, "reference": {"paper": 0.9651}},  # DataSciCoding's best programs
            "success_speed": {"rate": 0.5, "episodes": 16},  # env steps to the first success and to 0.5
            "pairs": [("POAD", "NTPO 0.9")],  # Welch's t-test on two groups' final values per seed
            "reference": {"label": "paper", "values": {"POAD, 8": (3.8, 4.0)}}},  # published values by group

Each report option's type, default, meaning and check is one field of `spec.ReportOptions`; an unknown
or malformed one stops the study when it loads, before any cell runs.

A pass may run part of the grid: `--seeds=1,2` the cells of those seeds, `--cells=POAD,"NTPO 0.9"` the
cells of those groups (a value of one axis, e.g. `--cells=action_length=8`, names every cell with it;
`--cells=POAD__seed=0` one cell by its directory name), both together the cells in both.  `--finish-within=MINUTES`
starts a cell only if it should finish in that time (from the cells of its group that have finished in the
workdir), for sessions that end.  `former_names=("gamma_w_seed0",)` names study files that once ran such a pass under a
name of their own: a workdir recorded under one is this study's.  `same_as={"GiGPO__seed=1": "GRPO__seed=1"}`
declares cells that are not run, being the same computation as another cell of the study (a rule written in
the study file, e.g. GRPO and GiGPO before any reward): the other cell's logs stand for each in every table and
figure, and the report names them; `"<study>/<cell>"` names a sibling study's cell (its workdir beside this one's).

Each cell is an ordinary run directory of `poad_jax.train` (`<workdir>/cells/<cell>`, the
workdir by default `./runs/studies/<name>`, relative to where the command runs), run as its own
process in the caller's working directory with it first on PYTHONPATH (a config that imports
the caller's own environment module works in the cells as it does for `train`), so
checkpoints, metrics and resume are the trainer's.
Re-running the same command skips finished cells and resumes the others; a
`kill -9` of the runner kills its trainers with it (they lose at most the
update in flight).  A finished cell whose trainer config equals a cell's
(in a sibling study's workdir: `runs/studies/*`) is reused, as a symlink,
instead of being run again.
"""


from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

from poad_jax.run.config.errors import ArgumentParser
from poad_jax.tools.study.page import keep_report
from poad_jax.tools.study.report import publish, write_report
from poad_jax.tools.study.scheduler import check_same_as, chosen_seeds, read_json, run_study
from poad_jax.tools.study.spec import STUDY_FILE, Study, StudyError, cells_labelled, load_study


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """`--seeds=1,2` as (1, 2); None when the option is absent."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise StudyError(f"--seeds takes whole numbers separated by commas, e.g. --seeds=1,2; got {text!r}") from None


def seeds_study(study: Study, seeds: tuple[int, ...]) -> Study:
    """The study restricted to `seeds`, named `<name>_seeds_3_4` for seeds (3, 4): its report (`--report
    --seeds=3,4`) goes to `<workdir>/<that name>/` and publishes as `<that name>.md`."""
    return dataclasses.replace(study, seeds=tuple(seeds), name=f"{study.name}_seeds_{'_'.join(map(str, seeds))}")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m poad_jax.study", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs a grid of training runs (cells) in their own processes, resumably, and writes a report:\n"
                    "learning curves with seed bands and a table of final results (report.md, return.png, ...).\n"
                    "Cells run in this directory, with it on PYTHONPATH (your own modules import).",
        epilog="examples:\n"
               "  python -m poad_jax.study --study=studies/gamma_w.py --workers=2   # re-run the same to resume\n"
               "  python -m poad_jax.study --study=studies/gamma_w.py --report      # aggregate only\n"
               "  python -m poad_jax.study --study=studies/gamma_w.py --report --seeds=3,4  # those seeds alone\n"
               "  python -m poad_jax.study --study=studies/gamma_w.py --cells=POAD,'NTPO gw=0.9'  # those groups only\n"
               "the study file's format: poad_jax/tools/study/cli.py; docs/guide.md has a small one")
    parser.add_argument("--study", required=True, help="study file, e.g. studies/gamma_w.py")
    parser.add_argument("--workdir", default=None, help="default: ./runs/studies/<study name>")
    parser.add_argument("--workers", type=int, default=1, help="cells trained at once (default 1)")
    parser.add_argument("--report", action="store_true", help="only aggregate what the cells have logged")
    parser.add_argument("--no-reuse", action="store_true", help="never reuse finished cells of sibling studies")
    parser.add_argument("--up-to", type=int, default=None, metavar="ENV_STEPS",
                        help="a first pass: train every cell only up to this many env steps (re-run without "
                             "it to continue them to the end)")
    parser.add_argument("--seeds", default=None, metavar="S[,S...]",
                        help="run only these of the study's seeds, e.g. --seeds=1,2 (a pass that fits one "
                             "session or one lent machine; the report covers every seed that has run); with "
                             "--report: a report of these seeds alone, in <workdir>/<study>_seeds_1_2/")
    parser.add_argument("--cells", default=None, metavar="LABEL[,LABEL...]",
                        help="run only these of the study's cells, as --seeds does: a group's label (e.g. POAD) "
                             "names its cells, a cell's directory name (e.g. POAD__seed=0) that one; with "
                             "--seeds, the cells in both")
    parser.add_argument("--finish-within", type=float, default=None, metavar="MINUTES",
                        help="start a cell only if it should finish within this many minutes from now (the "
                             "median time of its group's finished cells here, else the longest finished "
                             "cell's; a cell part-way scaled by what is left): for sessions that end")
    parser.add_argument("--publish", default=None, metavar="DIR",
                        help="also write the study's page, DIR/<study>.md, and its figures (e.g. docs/results): "
                             "the report beside the study's reading, studies/<study>.md, which it keeps")
    parser.add_argument("--keep-report", action="store_true",
                        help="with --publish: run nothing and write the page again from the study's reading, "
                             "keeping the report it holds (for cells that are not on this machine)")
    args = parser.parse_args(argv)
    try:
        check_flags(args)
        study = load_study(args.study)
        seeds = parse_seeds(args.seeds)
        cell_names = None if args.cells is None else cells_labelled(study, args.cells)
        if cell_names is not None and seeds is not None and not {
                name for name in cell_names if int(name.rsplit("__seed=", 1)[1]) in chosen_seeds(study, seeds)}:
            raise StudyError(f"no cell of --cells={args.cells} has a seed of --seeds={args.seeds}")
        if args.keep_report:
            if seeds is not None:
                study = seeds_study(study, chosen_seeds(study, seeds))
            print(f"published: {keep_report(study, pathlib.Path(args.publish))}")
            return 0
        # Relative to where the command runs, as train's ./runs is.
        workdir = pathlib.Path(args.workdir) if args.workdir else pathlib.Path("runs") / "studies" / study.name
        out = workdir
        if args.report:
            if not (workdir / STUDY_FILE).exists():
                raise StudyError(f"{workdir} holds no study yet: run it first (without --report)")
            recorded = read_json(workdir / STUDY_FILE) or {}
            if not study.recorded_in(recorded):
                raise StudyError(f"workdir {workdir} holds another study ({recorded.get('identity')})")
            check_same_as(study, workdir)
            if seeds is not None:  # a report of these seeds alone, beside the whole one
                study = seeds_study(study, chosen_seeds(study, seeds))
                out = workdir / study.name
        else:
            status = run_study(study, workdir, workers=args.workers, reuse=not args.no_reuse, up_to=args.up_to,
                               seeds=seeds, cell_names=cell_names,
                               finish_within=None if args.finish_within is None else args.finish_within * 60)
            failed = [name for name, s in status.items() if s == "failed"]
            later = [name for name, s in status.items() if s == "not started"]
            if later:
                print(f"{len(later)} cell(s) not started, as they would not finish within --finish-within: "
                      f"{', '.join(later[:5])}" + (" ..." if len(later) > 5 else "") + "; run them later")
            if failed:
                print(f"{len(failed)} cell(s) failed: {', '.join(failed[:5])}"
                      + (" ..." if len(failed) > 5 else "") + "; re-run the same command to retry them")
        path = write_report(study, workdir, out)
        print(f"report: {path}")
        if args.publish:
            print(f"published: {publish(study, workdir, pathlib.Path(args.publish), out)}")
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: re-run the same command to resume", file=sys.stderr)
        return 130
    return 0


def check_flags(args: argparse.Namespace) -> None:
    """StudyError (one line) for flags out of range or that contradict each other."""
    if args.workers < 1:
        raise StudyError(f"--workers must be >= 1, got {args.workers}")
    if args.finish_within is not None and not args.finish_within > 0:
        raise StudyError(f"--finish-within must be > 0 minutes, got {args.finish_within:g}")
    if args.report and args.finish_within is not None:
        raise StudyError("--finish-within chooses which cells start; --report runs nothing: drop one of them")
    if args.up_to is not None and args.up_to < 1:
        raise StudyError(f"--up-to must be >= 1 env step, got {args.up_to}")
    if args.report and args.up_to is not None:
        raise StudyError("--up-to chooses how far to run; --report runs nothing: drop one of them")
    if args.keep_report and (args.publish is None or args.report or args.cells or args.up_to):
        raise StudyError("--keep-report rewrites a published page: give --publish=DIR and nothing that runs "
                         "or reports")
    if args.report and args.cells is not None:
        raise StudyError("--cells chooses which cells run; a report covers every cell that has run "
                         "(--seeds narrows it): drop --cells")


if __name__ == "__main__":
    sys.exit(main())
