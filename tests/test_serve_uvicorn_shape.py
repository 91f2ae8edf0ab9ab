"""The HTTP front's connection limits subclass uvicorn's private HttpToolsProtocol
(serve/http_limits.py): these tests fail loudly, naming the class, when a uvicorn upgrade
changes what the subclass relies on, and check that the installed uvicorn is one the serve
extra's pin allows."""

from __future__ import annotations

import os
import re

import pytest

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httptools")

from fastloop.serve import http_limits  # noqa: E402
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_installed_uvicorn_keeps_the_shape_http_limits_relies_on():
    problems = http_limits.shape_problems()
    assert not problems, (f"uvicorn {uvicorn.__version__} changed {http_limits.PROTOCOL}, which "
                          f"fastloop.serve.http_limits.LimitedHttpProtocol subclasses:\n  " + "\n  ".join(problems))


def test_the_installed_uvicorn_is_within_the_serve_extras_pin():
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        (spec,) = re.findall(r'"(uvicorn\[standard\][^"]*)"', f.read())
    requirement = Requirement(spec)
    assert requirement.specifier.contains(uvicorn.__version__), \
        f"uvicorn {uvicorn.__version__} is outside the serve extra's pin {spec}: run the HttpToolsProtocol " \
        "shape test and the serve tests with it, then move the pin"


def test_a_changed_method_or_a_lost_attribute_is_named(monkeypatch):
    monkeypatch.setattr(HttpToolsProtocol, "on_url", lambda self, url, more: None)
    monkeypatch.delattr(HttpToolsProtocol, "send_400_response")
    problems = http_limits.shape_problems()
    assert f"{http_limits.PROTOCOL}.on_url() takes ['url', 'more'], not ['url']" in problems
    assert f"{http_limits.PROTOCOL}.send_400_response() is gone" in problems
    monkeypatch.setattr(http_limits, "CYCLE_ATTRIBUTES", ("response_started", "no_such_field"))
    assert any("RequestResponseCycle no longer sets self.no_such_field" in p for p in http_limits.shape_problems())
    assert RequestResponseCycle is not None


def test_uvicorn_config_refuses_to_serve_without_the_limits_when_a_method_is_gone(monkeypatch):
    monkeypatch.delattr(HttpToolsProtocol, "on_headers_complete")
    with pytest.raises(RuntimeError, match=r"HttpToolsProtocol.*on_headers_complete\(\) is gone"):
        http_limits.uvicorn_config(lambda scope, receive, send: None)
