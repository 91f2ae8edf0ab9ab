"""The tests' private C hooks (fastloop._core._emit_events, _queue_load, _pool_workers;
fastloop._cuda._NNContext) are compiled only into builds made with FASTLOOP_TESTING=1
(make build, make test, make test-pythons), never into the wheels: tests needing them skip,
saying so, against an installed wheel."""

import pytest

from fastloop import _core

WHY_ABSENT = ("this fastloop was built without the tests' hooks "
              "(FASTLOOP_TESTING=1 compiles them in: make build does; a wheel never has them)")
CORE_HOOKS = hasattr(_core, "_emit_events")
needs_core_hooks = pytest.mark.skipif(not CORE_HOOKS, reason=WHY_ABSENT)
