"""What the synthetic generator writes (``GeneratorConfig``), validated on construction: each option
error names the option and the value given, so a preset or ``--set`` typo fails before any file is written.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .churn import item_generations
from .convert import TS_MAX
from .sessions import SessionParams


def _positive(name: str, value: float, integer: bool = False) -> None:
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"GeneratorConfig: option '{name}' must be an integer; got {value!r}")
    if not value > 0:
        raise ValueError(f"GeneratorConfig: option '{name}' must be > 0; got {value!r}")


def _fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"GeneratorConfig: option '{name}' must be in [0, 1]; got {value!r}")


@dataclass
class GeneratorConfig:
    """What to generate. Lengths are total events per user over all logs (valid events only).

    ``length_dist`` ``lognormal`` uses ``median``/``sigma``; ``pareto`` uses ``pareto_alpha``/``pareto_min``.
    ``zipf`` is the item-popularity exponent (higher: more repeated ids, more batch overlap).
    ``malformed_fraction`` adds that share of bad rows to each text log (on top of the valid ones).
    ``sessions`` plants the session structure of ``sessions.py`` (items and timestamps; the actions
    stay as drawn): ``session_len`` mean events per session, ``topics`` interest topics,
    ``session_noise`` share of exploring events. It replaces the Markov chain (``markov_prob`` = 0).
    ``item_lifetime_days`` > 0: each of the ``n_items`` item slots gets a new id every that many days
    (``churn.py``: ``n_items`` alive at once); ``user_lifetime_days`` > 0: users are active for about
    that many days each. 0 (the default) turns either off.
    """

    name: str = "synthetic"
    seed: int = 0
    n_users: int = 200
    n_items: int = 1_000
    length_dist: str = "lognormal"
    median: float = 15.0
    sigma: float = 1.0
    pareto_alpha: float = 1.5
    pareto_min: int = 5
    min_len: int = 1
    max_len: int = 21_000
    zipf: float = 1.1
    markov_prob: float = 0.0
    markov_a: int = 31
    markov_b: int = 7
    sessions: bool = False
    session_len: float = 3.0
    topics: int = 50
    session_noise: float = 0.1
    purchase_fraction: float = 0.1
    review_fraction: float = 0.05
    click_files: int = 2
    purchase_files: int = 1
    review_files: int = 1
    row_group_rows: int = 65_536
    start_time: int = 1_600_000_000
    window_days: float = 365.0
    malformed_fraction: float = 0.0
    chunk_events: int = 2_000_000
    user_table: bool = True
    item_lifetime_days: float = 0.0
    user_lifetime_days: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("GeneratorConfig: option 'name' must be a non-empty string")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"GeneratorConfig: option 'seed' must be an integer >= 0; got {self.seed!r}")
        for key in (
            "n_users",
            "n_items",
            "pareto_min",
            "min_len",
            "max_len",
            "markov_a",
            "topics",
            "click_files",
            "purchase_files",
            "review_files",
            "row_group_rows",
            "chunk_events",
        ):
            _positive(key, getattr(self, key), integer=True)
        for key in ("median", "sigma", "pareto_alpha", "zipf", "window_days"):
            _positive(key, getattr(self, key))
        for key in ("markov_prob", "purchase_fraction", "review_fraction", "malformed_fraction", "session_noise"):
            _fraction(key, getattr(self, key))
        if self.length_dist not in ("lognormal", "pareto"):
            raise ValueError(
                f"GeneratorConfig: option 'length_dist' must be lognormal or pareto; got {self.length_dist!r}"
            )
        self._check_sessions()
        self._check_churn()
        if self.min_len > self.max_len:
            raise ValueError(f"GeneratorConfig: option 'min_len' ({self.min_len}) exceeds 'max_len'")
        if self.n_items > 2**31 or self.markov_a >= 2**31 or not 0 <= self.markov_b < 2**31:
            raise ValueError("GeneratorConfig: options 'n_items', 'markov_a', 'markov_b' must be < 2**31")
        if self.purchase_fraction + self.review_fraction > 1.0:
            raise ValueError("GeneratorConfig: options 'purchase_fraction' + 'review_fraction' exceed 1")
        if not 0 <= self.start_time + self.window_days * 86_400 + self.max_len < TS_MAX:
            raise ValueError("GeneratorConfig: options 'start_time' + 'window_days' must end before 2100")

    def _check_sessions(self) -> None:
        if not isinstance(self.sessions, bool):
            raise ValueError(f"GeneratorConfig: option 'sessions' must be true or false; got {self.sessions!r}")
        if not self.session_len >= 1.0:
            raise ValueError(f"GeneratorConfig: option 'session_len' must be >= 1; got {self.session_len!r}")
        if self.topics > self.n_items:
            raise ValueError(f"GeneratorConfig: option 'topics' ({self.topics}) exceeds 'n_items'")
        if self.sessions and self.markov_prob > 0:
            raise ValueError(
                "GeneratorConfig: options 'sessions' and 'markov_prob' are two planted structures; use one"
            )

    def _check_churn(self) -> None:
        for key in ("item_lifetime_days", "user_lifetime_days"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(
                    f"GeneratorConfig: option '{key}' must be a number of days >= 0 (0: off); got {value!r}"
                )
        if self.user_lifetime_days and self.sessions:
            raise ValueError(
                "GeneratorConfig: option 'user_lifetime_days' needs sessions = false (sessions set their own times)"
            )
        if self.item_lifetime_days and self.n_items * self.item_generations() >= 2**31:
            raise ValueError(
                f"GeneratorConfig: option 'item_lifetime_days' ({self.item_lifetime_days}) gives "
                f"{self.item_generations()} generations of {self.n_items} items: ids must stay < 2**31"
            )

    def item_generations(self) -> int:
        """Generations an item slot can have (1 without item churn): item ids are < n_items times this."""
        if not self.item_lifetime_days:
            return 1
        return item_generations(self.window_days, self.item_lifetime_days, self.max_len)

    def session_params(self) -> SessionParams:
        return SessionParams(**{f.name: getattr(self, f.name) for f in fields(SessionParams)})

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
