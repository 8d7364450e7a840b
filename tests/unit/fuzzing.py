"""What the fuzz tests (tests/unit/test_fuzz_*.py) share: their example budget and the
strategies for outside input.

In the fast tier each fuzz test runs a bounded number of examples (`bounded`); with
HYPOTHESIS_PROFILE=fuzz (`make fuzz`) every one of them runs the profile's many more.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings

__all__ = ["FUZZ", "bounded", "check_read", "json_values", "settings_file"]

_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20000")),
    deadline=None,
    suppress_health_check=_SLOW,
)
# only the @example cases (the crashes fuzzing found), e.g. to see them fail without a fix
settings.register_profile("examples", phases=[Phase.explicit])
FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
if os.environ.get("HYPOTHESIS_PROFILE") in ("fuzz", "examples"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def bounded(examples: int) -> Callable[[Any], Any]:
    """A fuzz test's settings: `examples` in the fast tier, the fuzz profile's otherwise."""
    if FUZZ:
        return settings(deadline=None, suppress_health_check=_SLOW)
    return settings(max_examples=examples, deadline=None, suppress_health_check=_SLOW)


# any JSON value: what orjson / json.loads can hand the parsers
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


@contextmanager
def settings_file(text: str) -> Iterator[None]:
    """CDC_CONFIG naming a file holding `text`, and no other CDC_* variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cdc.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        with mock.patch.dict(os.environ, env | {"CDC_CONFIG": str(path)}, clear=True):
            yield


def check_read(text: str, secrets: list[str] = ()) -> Settings | None:  # type: ignore[assignment]
    with settings_file(text):
        try:
            return load_settings()
        except ConfigError as exc:
            message = str(exc)
    assert message and "\n" not in message and "\r" not in message, message
    for secret in secrets:
        assert secret not in message, message
    return None
