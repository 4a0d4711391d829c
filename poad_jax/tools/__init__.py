"""Tools around trained runs: evaluation, adapter export, study grids and
their reports, the tabular proofs of the backups (`proofs`) and closed-form
returns (`theory`)."""
