"""Base class for process-wide switches that work as a call and as a ``with`` that restores the old state."""

from __future__ import annotations

from typing import Any


class Switch:
    """Applies a process-wide setting on construction; ``restore()`` (or leaving a ``with``) puts it back.

    Subclasses implement ``_get_state()`` and ``_set_state(state)`` plus ``_apply()``; this mirrors
    ``torch.set_grad_enabled``: ``enable_x()`` changes the process now, ``with enable_x(): ...`` only inside.
    """

    def __init__(self) -> None:
        self._saved = self._get_state()
        self._apply()
        self._restored = False

    def _get_state(self) -> Any:
        raise NotImplementedError

    def _set_state(self, state: Any) -> None:
        raise NotImplementedError

    def _apply(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        """Put back the state that was in force before this switch was made."""
        if not self._restored:
            self._set_state(self._saved)
            self._restored = True

    def __enter__(self) -> Switch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
