"""The params task's session threshold: picked on the validation scores, −inf handled."""

from __future__ import annotations

import numpy as np

from rnnkit.app.tasks.params.thresholds import session_threshold


def test_session_threshold_by_hand() -> None:
    """Empirical quantile over the sessions' scores; sessions with no checked vector
    (−inf) count as below any threshold; none checked at all leaves z alone."""
    t, how = session_threshold(np.array([0.5, 3.0, 1.0, -np.inf, 2.0]), 0.2)
    assert how == "empirical quantile" and 2.0 < t < 3.0  # one of five above
    t, _ = session_threshold(np.array([0.5, 3.0, -np.inf, -np.inf, -np.inf]), 0.2)
    assert 0.5 < t < 3.0
    t, how = session_threshold(np.array([-np.inf, -np.inf]), 0.1)
    assert t == -np.inf and how == "no validation vector was checked"
