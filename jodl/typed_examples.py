"""An example family with a typed payload (pydantic, when installed).

Apart from :mod:`jodl.examples`: loading one of those families (``jodl jobs add noop``)
does not import pydantic, a seventh of the time ``jodl jobs add --from`` took for
100,000 jobs (``cli_add_jobs_per_s`` in ``bench/throughput.py``).
"""

from __future__ import annotations

from typing import Any

from .family import Family

try:  # pydantic is not a dependency of the library; this example uses it when present
    from pydantic import BaseModel, PositiveInt
except ImportError:  # pragma: no cover - the test extra installs it
    BaseModel = None  # type: ignore[assignment,misc]


if BaseModel is not None:

    class Size(BaseModel):
        """The payload of :class:`Area`: a rectangle's sides."""

        model_config = {"extra": "forbid"}
        w: PositiveInt
        h: PositiveInt

else:  # pragma: no cover
    Size = None  # type: ignore[assignment,misc]


class Area(Family):
    """A family with a typed payload (:attr:`Family.payload_model`): its jobs are checked
    where they are added, and ``run`` gets a :class:`Size`."""

    name = "area"
    idempotent = True
    payload_model = Size

    def run(self, payload: Any) -> Any:
        return {"pixels": payload.w * payload.h}
