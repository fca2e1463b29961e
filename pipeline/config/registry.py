"""Which :class:`~pipeline.methods.base.Method` owns a config's ``speculation`` section.

Reads and writes nothing, and imports nothing of the project: each method object registers itself
here when its module creates it (``Method.__init__``), and :attr:`DeploymentConfig.method_info`
looks the section's type up. So the config asks the methods without importing the methods
package, whose modules build on the config's sections (the config ↔ methods cycle).
"""

from __future__ import annotations

from typing import Any

_BY_SECTION: dict[type, Any] = {}


def register_method(method: Any) -> None:
    """Called once per method object: its ``section`` class now answers to it."""
    _BY_SECTION[method.section] = method


def method_of(section: Any) -> Any:
    """The method object whose config section ``section`` is an instance of."""
    return _BY_SECTION[type(section)]
