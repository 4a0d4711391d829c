"""Tools around trained runs: evaluation, adapter export, study grids and
their reports, and closed-form returns (`theory`)."""
