"""docs/frameworks.md stays true: its Django section runs as written (a project made of its
settings and tasks, its worker command, its view code in a fresh process), and its Flask
and FastAPI code is the code of the examples their tests run (tests/test_flask_example.py,
tests/test_fastapi_example.py)."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, Cluster, need_packages
from tests.test_readme import bash_blocks, python_blocks, section

PAGE = (ROOT / "docs" / "frameworks.md").read_text()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("heading", "example"),
    [("Flask", "examples/flask_app.py"), ("FastAPI", "examples/fastapi_service.py")],
)
def test_the_page_shows_the_examples_code(heading: str, example: str) -> None:
    code = (ROOT / example).read_text()
    blocks = python_blocks(section(PAGE, heading))
    assert blocks
    for block in blocks:
        assert block in code, f"docs/frameworks.md ({heading}) shows code not in {example}"
    assert example in section(PAGE, heading)


@pytest.mark.system
def test_the_django_section_runs_as_written(
    cluster: Cluster, redis_url: str, prefix: str, tmp_path: Path, r: redis.Redis
) -> None:
    need_packages("django", install="pip install 'queueworks[django]'")
    import django

    django_section = section(PAGE, "Django")
    settings, tasks, view = python_blocks(django_section)
    assert settings.startswith("# mysite/settings.py") and tasks.startswith("# myapp/tasks.py")
    settings = settings.replace("redis://localhost:6379/0", redis_url)
    settings = settings.replace('"prefix": "qw"', f'"prefix": "{prefix}"')
    if django.VERSION < (6, 0):  # the backport, as the page says
        tasks = tasks.replace("from django.tasks import", "from django_tasks import")
        apps = '["django_tasks"]'
    else:
        apps = "[]"
    project = tmp_path / "project"
    for package, body in (
        ("mysite", f'SECRET_KEY = "x"\nUSE_TZ = True\nINSTALLED_APPS = {apps}\n{settings}'),
        ("myapp", None),
    ):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("")
        if body is not None:
            (project / package / "settings.py").write_text(body)
    (project / "myapp" / "tasks.py").write_text(tasks)

    commands = [
        shlex.split(line.rstrip(" &")) for line in bash_blocks(django_section)[0].splitlines()
    ]
    assert [c[:2] for c in commands] == [["queueworks", "controller"], ["queueworks", "worker"]]
    env = {"PYTHONPATH": f"{ROOT}:{project}"}
    cluster.spawn(commands[0][1:], "controller", env)
    cluster.spawn(commands[1][1:], "django-worker", env)
    cluster.wait_workers(r, 1)

    code = "import django\ndjango.setup()\n" + view
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env={**cluster.env, **env, "DJANGO_SETTINGS_MODULE": "mysite.settings"},
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr + cluster.logs()
    status, workers = ran.stdout.strip().splitlines()
    assert status == "SUCCESSFUL welcome mail sent to user 42"
    (worker,) = ast.literal_eval(workers)  # a list of one worker id
    assert re.fullmatch(r"[\w.-]+", worker)
