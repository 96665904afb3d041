"""The labs in a real browser: JupyterLab + headless Chromium, driven by selenium.

JupyterLab is where the course is used, so every lab is opened there the way a student opens
it (`make lab`): one JupyterLab server on a free port of 127.0.0.1 with a token, one headless
Chromium, the labs one after another. A lab is not executed a second time: nbval has just
executed it (``make test`` runs the labs first; ../conftest.py keeps that execution's
outputs and the explorer's inputs). For each lab the test checks that

* opening it does not mark it modified (a student is not asked to save changes they did not
  make: the stored notebook metadata must already hold what JupyterLab writes into it);
* every code cell ran, without an error output;
* figures are displayed as images;
* in a lab with an explorer, the explorer, called in a live kernel with the inputs the lab
  computed, renders its controls (not "Error displaying widget") and moving its first
  slider redraws its figure.

Run alone (``pytest tests/test_browser.py``, no nbval in the session), the test falls back
to Run -> Run All Cells in JupyterLab, within a deadline, and checks the same.
It saves screenshots in build/screenshots/ for a person to look at. The server serves a
copy of labs/ in a temporary folder, so nothing in the repository is written.

Needs /usr/bin/chromium and /usr/bin/chromedriver (Debian: `apt-get install chromium
chromium-driver`; .ci/run installs them) and selenium; without them the browser tests are
skipped with the reason in pytest's summary. Deselect them with `-m "not browser"`.
Environment: PARLAB_CHROMIUM / PARLAB_CHROMEDRIVER (other binaries),
PARLAB_BROWSER_DEADLINE (seconds for one lab's Run All, default 300).

The fast tests at the end (no browser) guard the stored notebooks: metadata as JupyterLab
writes it, no outputs.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
LABS_DIR = ROOT / "labs"
LABS = sorted(LABS_DIR.glob("*.ipynb"))
SCREENSHOTS = ROOT / "build" / "screenshots"

CHROMIUM = os.environ.get("PARLAB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PARLAB_CHROMEDRIVER", "/usr/bin/chromedriver")
RUN_DEADLINE = float(os.environ.get("PARLAB_BROWSER_DEADLINE", "300"))
OPEN_DEADLINE = 120.0        # page load + kernel start (torch/TF are not imported yet)

STDERR_MIME = "application/vnd.jupyter.stderr"
# As `make lab` starts JupyterLab (see parlab/labserver.py).
CONTENTS_MANAGER = "--ServerApp.contents_manager_class=parlab.labserver.LabsContentsManager"


# ---------------------------------------------------------------------------------------
# What the stored notebooks must hold (checked without a browser, below, and in it).
# JupyterLab replaces the notebook's "kernelspec" with {name, display_name, language} of the
# kernel it starts and "language_info" with the kernel's language_info; a stored value that
# differs marks the notebook modified as it opens.
# ---------------------------------------------------------------------------------------

def kernel_metadata():
    """(kernelspec, language_info) as JupyterLab writes them for this environment's kernel."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    kernelspec = {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    return kernelspec, dict(IPythonKernel.language_info)


def code_sources(nb_path):
    nb = json.loads(Path(nb_path).read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def uses_widgets(nb_path):
    """An explorer: a ``labNN.*_explorer(...)`` call (or the older ``parlab.widgets.*``)."""
    return any("widgets." in src or "_explorer(" in src for src in code_sources(nb_path))


def makes_plots(nb_path):
    return any(re.search(r"\b(plot|plt)\.", src) for src in code_sources(nb_path))


# ---------------------------------------------------------------------------------------
# JupyterLab server and browser (one each for all labs)
# ---------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(procs, grace=5.0):
    """Terminate these processes (already collected), then kill what is left."""
    alive = []
    for p in procs:
        try:
            p.terminate()
            alive.append(p)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


class Lab:
    """A JupyterLab server on 127.0.0.1 serving a copy of labs/, with a private config."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.root = tmp / "labs"
        shutil.copytree(LABS_DIR, self.root,
                        ignore=shutil.ignore_patterns("traces", ".ipynb_checkpoints"))
        self.token = secrets.token_hex(24)
        self._explorer_kernel = None          # explorer_kernel(): started on first use
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home = tmp / "jupyter"
        env = dict(os.environ)
        # tests/conftest.py sets MPLBACKEND=Agg for pytest; a kernel that inherits it draws no
        # inline figures. A student's kernel does not have it.
        env.pop("MPLBACKEND", None)
        env.update(
            JUPYTER_CONFIG_DIR=str(home / "config"),
            JUPYTER_DATA_DIR=str(home / "data"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(home / "config" / "lab" / "user-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(home / "config" / "lab" / "workspaces"),
            IPYTHONDIR=str(home / "ipython"),
        )
        # Answer "get notified about Jupyter news?" (Never) so its pop-up covers nothing.
        settings = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", "--port-retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               CONTENTS_MANAGER]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log_path = tmp / "jupyterlab.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait_ready(60.0)

    def log_tail(self, n=3000):
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _wait_ready(self, deadline_s):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                self.api("GET", "/api/status")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {deadline_s:.0f} s:\n"
                           + self.log_tail())

    def api(self, method, path, timeout=10.0, body=None):
        headers = {"Authorization": f"token {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def descendants(self):
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def attach(self, path: str, kernel_id: str):
        """Open ``path``'s session on a running kernel: JupyterLab then connects the
        notebook to that kernel instead of starting one."""
        self.api("POST", "/api/sessions", timeout=30.0, body={
            "path": path, "name": path, "type": "notebook", "kernel": {"id": kernel_id}})

    def explorer_kernel(self) -> str:
        """One kernel for every lab's explorer, started once: each explorer notebook loads
        its own inputs, and the imports (torch, matplotlib, ipywidgets) are paid once, not
        per lab (a fresh kernel per explorer cost 3-5 s each on 2 cores)."""
        if self._explorer_kernel is None:
            self._explorer_kernel = self.api("POST", "/api/kernels", timeout=60.0)["id"]
        return self._explorer_kernel

    def _kernel_processes(self, kernel_id):
        found = []
        for p in self.descendants():
            try:
                if any(kernel_id in part for part in p.cmdline()):
                    found.append(p)
                    found.extend(p.children(recursive=True))
            except psutil.Error:
                pass
        return found

    def shutdown_kernels(self):
        """Shut down every session's kernel but the explorers' shared one, and wait until
        their processes are gone."""
        keep = self._explorer_kernel
        spared = {p.pid for p in self._kernel_processes(keep)} if keep else set()
        before = [p for p in self.descendants() if p.pid not in spared]
        for session in self.api("GET", "/api/sessions"):
            if keep and session.get("kernel", {}).get("id") == keep:
                continue
            try:
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30.0)
            except (OSError, urllib.error.URLError):
                pass
        _kill_tree([p for p in before if p.is_running()], grace=10.0)

    def close(self):
        procs = self.descendants()
        try:
            if self.proc.poll() is None:
                try:
                    self.api("POST", "/api/shutdown")
                except (OSError, urllib.error.URLError):
                    self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            _kill_tree([p for p in procs if p.is_running()])
            self._log.close()


def _browser_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER)
               if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if missing:
        pytest.skip(f"browser tests need Chromium: {' and '.join(missing)} not found "
                    "(Debian: apt-get install chromium chromium-driver; .ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("browser tests need selenium (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def session(tmp_path_factory, request):
    """One JupyterLab server and one headless Chromium for all labs; both gone afterwards."""
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    lab = Lab(tmp_path_factory.mktemp("browser"))
    driver = service = None
    timings = {}
    try:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"):
            options.add_argument(flag)
        # Leaving a notebook with unsaved outputs (after a failed check) must not block the
        # next lab behind a "leave this page?" prompt.
        options.set_capability("unhandledPromptBehavior", "accept")
        service = Service(CHROMEDRIVER)
        driver = webdriver.Chrome(options=options, service=service)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        yield lab, driver, timings
    finally:
        browser_procs = []
        if service is not None and service.process is not None:
            try:
                browser_procs = psutil.Process(service.process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        try:
            if driver is not None:
                driver.quit()
        finally:
            _kill_tree([p for p in browser_procs if p.is_running()])
            lab.close()
        if timings:
            _report(request.config, timings)


def _report(config, timings):
    lines = [f"{'lab':<28}{'open':>7}{'run all':>9}{'checks':>8}{'total':>8}  outputs from"]
    for name, t in timings.items():
        lines.append(f"{name:<28}{t['open']:>6.1f}s{t['run']:>8.1f}s{t['checks']:>7.1f}s"
                     f"{t['total']:>7.1f}s  {t['how']}")
    lines.append(f"{'all labs':<28}{'':>24}{sum(t['total'] for t in timings.values()):>7.1f}s")
    text = "\n".join(lines)
    (SCREENSHOTS / "timings.txt").write_text(text + "\n")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(f"browser pass (screenshots in {SCREENSHOTS}):")
            for line in lines:
                reporter.write_line("  " + line)


# ---------------------------------------------------------------------------------------
# Driving JupyterLab
# ---------------------------------------------------------------------------------------

JS_STATE = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) return null;
const ind = panel.querySelector('.jp-Notebook-ExecutionIndicator');
const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent.trim());
const dirty = !!document.querySelector('.lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-dirty');
const kernel = panel.querySelector('.jp-KernelName, .jp-Toolbar-kernelName');
return {status: ind ? ind.getAttribute('data-status') : null, prompts: prompts, dirty: dirty,
        kernel: kernel ? kernel.textContent.trim() : null,
        cells: panel.querySelectorAll('.jp-Cell').length};
"""


def _state(driver):
    return driver.execute_script(JS_STATE)


def _wait(what, predicate, deadline_s, poll=0.25):
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")


def _menu(driver, menu, *commands):
    """Click a menu bar item, then the entry that runs one of these commands."""
    from selenium.webdriver.common.by import By

    for item in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item"):
        if item.text.strip() == menu:
            item.click()
            break
    else:
        raise AssertionError(f"no {menu!r} menu in JupyterLab's menu bar")
    selector = ", ".join(f'.lm-Menu-item[data-command="{c}"]' for c in commands)
    entry = _wait(f"{' or '.join(commands)} in the {menu} menu",
                  lambda: driver.find_elements(By.CSS_SELECTOR, selector), 10.0)
    entry[0].click()


def _last_ran(prompts, sources):
    """The code cell with the highest execution count, as 'code cell k of n ("first line")'."""
    numbered = [(int(m.group(1)), i) for i, p in enumerate(prompts)
                if (m := re.match(r"\[(\d+)\]", p))]
    if not numbered:
        return "none"
    k = max(numbered)[1]
    lines = sources[k].strip().splitlines() if k < len(sources) else []
    head = lines[0][:80] if lines else ""
    return f"code cell {k + 1} of {len(prompts)} ({head!r})"


def _open(lab, driver, name, settle=True):
    """Open ``name`` and wait for its kernel; ``settle``: then give the kernel's metadata
    time to arrive, so that a dirty mark it causes is seen (not needed where the notebook
    is ours, not a lab)."""
    driver.get(f"{lab.url}/lab/workspaces/test-{Path(name).stem}/tree/{name}?token={lab.token}")

    cells = len(json.loads((lab.root / name).read_text(encoding="utf-8"))["cells"])

    def ready():
        s = _state(driver)
        return s if (s and s["cells"] == cells and s["status"] == "idle"
                     and s["kernel"] not in (None, "", "No Kernel")) else None

    try:
        state = _wait(f"{name} to open with an idle kernel", ready, OPEN_DEADLINE)
    except AssertionError as err:
        raise AssertionError(f"{err}; last state: {_state(driver)}\n{lab.log_tail()}") from None
    # The kernel's spec and language_info reach the notebook's metadata as the kernel
    # connects; give JupyterLab a moment to apply them before looking at the dirty mark.
    if settle:
        time.sleep(1.0)
    return state


def _started(s) -> bool:
    """Run All has started: the kernel is busy, a cell is queued ([*]), or every code cell
    already has its number (a short notebook on a warm kernel can run between two looks)."""
    numbered = [p for p in s["prompts"] if re.match(r"\[(\d+|\*)\]", p)]
    return s["status"] == "busy" or "[*]:" in s["prompts"] or (
        bool(s["prompts"]) and len(numbered) == len(s["prompts"]))


def _run_all(driver, name, sources):
    # First the queue fills ([*] prompts / busy), then it drains. On a loaded machine the
    # menu's click can be lost while JupyterLab is busy (a loaded run once waited 30 s for
    # a start that never came): the command is given once more before giving up.
    for attempt in (1, 2):
        _menu(driver, "Run", "runmenu:run-all", "notebook:run-all-cells")
        try:
            _wait(f"{name} to start running", lambda: _started(_state(driver)), 30.0,
                  poll=0.1)
            break
        except AssertionError:
            if attempt == 2:
                raise
    end = time.monotonic() + RUN_DEADLINE
    done_since = None
    while True:
        s = _state(driver)
        done = s["status"] == "idle" and not any(p.startswith("[*]") for p in s["prompts"])
        if done:
            done_since = done_since or time.monotonic()
            if time.monotonic() - done_since > 1.0:
                return s
        else:
            done_since = None
        if time.monotonic() > end:
            running = [i + 1 for i, p in enumerate(s["prompts"]) if p.startswith("[*]")]
            raise AssertionError(
                f"{name}: Run All not finished after {RUN_DEADLINE:.0f} s; last cell that ran: "
                f"{_last_ran(s['prompts'], sources)}; still running or queued: code cells "
                f"{running}")
        time.sleep(0.5)


def _cell_head(cell):
    src = "".join(cell["source"]).strip().splitlines()
    return src[0][:80] if src else ""


# ---------------------------------------------------------------------------------------
# The browser test, one per lab
# ---------------------------------------------------------------------------------------

def _executed_copy(config, name):
    """The lab as nbval executed it in this session (see ../conftest.py), or None."""
    path = getattr(config, "parlab_executed_labs", {}).get(name)
    return path if path is not None and path.exists() else None


@pytest.mark.browser
@pytest.mark.timeout(RUN_DEADLINE + OPEN_DEADLINE + 180)
@pytest.mark.parametrize("nb_path", LABS, ids=[p.stem for p in LABS])
def test_lab_in_jupyterlab(session, nb_path, request):
    """Open the lab as nbval executed it (else Run All here); figures, errors, explorer."""
    lab, driver, timings = session
    name = nb_path.name
    for old in (f"{nb_path.stem}.png", f"{nb_path.stem}.FAILED.png"):
        (SCREENSHOTS / old).unlink(missing_ok=True)
    executed = _executed_copy(request.config, name)
    if executed is not None:        # serve nbval's execution instead of running it again
        stored = json.loads(nb_path.read_text(encoding="utf-8"))["metadata"]
        assert json.loads(executed.read_text(encoding="utf-8"))["metadata"] == stored
        shutil.copy(executed, lab.root / name)
        for extra in executed.parent.glob(f"{nb_path.stem}-explorer.*"):
            shutil.copy(extra, lab.root / extra.name)
    t0 = time.monotonic()
    try:
        state = _open(lab, driver, name)
        t_open = time.monotonic()
        assert not state["dirty"] and not _state(driver)["dirty"], (
            f"{name} is marked modified right after opening, before anything ran: its stored "
            "metadata differs from what JupyterLab writes (kernelspec / language_info; "
            "see test_stored_metadata_matches_the_kernel)")
        if executed is None:
            _run_all(driver, name, code_sources(lab.root / name))
            _menu(driver, "File", "docmanager:save")
            _wait(f"{name} to be saved", lambda: not _state(driver)["dirty"], 30.0)
        t_run = time.monotonic()
        _check_outputs(lab, driver, name, nb_path)

        explorer = lab.root / f"{nb_path.stem}-explorer.ipynb"
        if uses_widgets(nb_path) and executed is not None:
            assert explorer.exists(), (f"{name} has an explorer, but nbval's run left no "
                                       "inputs for it (see ../conftest.py)")
            _scroll_to(driver, ".jp-OutputArea-output img")
            driver.save_screenshot(str(SCREENSHOTS / f"{nb_path.stem}.png"))
            lab.attach(explorer.name, lab.explorer_kernel())
            _open(lab, driver, explorer.name, settle=False)
            _run_all(driver, explorer.name, code_sources(explorer))
            _check_widgets(driver, name)
            driver.save_screenshot(str(SCREENSHOTS / f"{nb_path.stem}-explorer.png"))
        elif uses_widgets(nb_path):
            _check_widgets(driver, name)
            driver.save_screenshot(str(SCREENSHOTS / f"{nb_path.stem}.png"))
        else:
            _scroll_to(driver, ".jp-OutputArea-output img")
            driver.save_screenshot(str(SCREENSHOTS / f"{nb_path.stem}.png"))
        t_end = time.monotonic()
        timings[name] = {"open": t_open - t0, "run": t_run - t_open, "checks": t_end - t_run,
                         "total": t_end - t0,
                         "how": "nbval's run" if executed is not None else "Run All here"}
    except Exception:
        try:
            driver.save_screenshot(str(SCREENSHOTS / f"{nb_path.stem}.FAILED.png"))
        except Exception:
            pass
        raise
    finally:
        lab.shutdown_kernels()


def _check_outputs(lab, driver, name, nb_path):
    """Every code cell ran, none failed, and every figure is displayed as an image."""
    nb = json.loads((lab.root / name).read_text(encoding="utf-8"))
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]

    def where(i, c):   # numbered as JupyterLab's status bar numbers cells
        return f"cell {i + 1} of {len(nb['cells'])} ({_cell_head(c)!r})"

    errors = [f"{where(i, c)}: {o.get('ename')}: {o.get('evalue')}"
              for i, c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{name}: error output:\n" + "\n".join(errors)
    not_run = [where(i, c) for i, c in code if c.get("execution_count") is None]
    assert not not_run, f"{name}: cells without an execution count: {not_run}"

    images = sum("image/png" in o.get("data", {}) for _, c in code for o in c["outputs"])
    if makes_plots(nb_path):
        assert images >= 1, f"{name} plots, but no figure came out (image/png outputs: 0)"

    def rendered():
        return driver.execute_script("""
            return [...document.querySelectorAll(
                '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img')]
              .filter(i => i.complete && i.naturalWidth > 0).length;""")
    try:   # outputs of a long notebook are laid out as it scrolls into view
        _wait(f"{name}: {images} figures to be displayed", lambda: rendered() >= images, 30.0)
    except AssertionError:
        raise AssertionError(f"{name}: {images} figures in the outputs, {rendered()} displayed "
                             "as images") from None


def _scroll_to(driver, selector):
    driver.execute_script("""
        const el = document.querySelector(
            '.jp-NotebookPanel:not(.lm-mod-hidden) ' + arguments[0]);
        if (el) el.scrollIntoView({block: 'center'});""", selector)
    time.sleep(0.5)


WIDGET_OUT = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output .jupyter-widgets"

# The explorer is read afresh on every look: a redraw replaces its elements, and an element
# found before it would be stale (StaleElementReferenceException).
JS_EXPLORER = """
const slider = document.querySelector(arguments[0] + ' .widget-slider');
if (!slider) return null;
const box = slider.closest('.widget-vbox');
const img = box ? box.querySelector('.widget-output img') : null;
const readout = slider.querySelector('.widget-readout');
const errs = box ? [...box.querySelectorAll('[data-mime-type="%s"]')].map(e => e.textContent)
                 : [];
return {value: readout ? readout.textContent.trim() : null,
        picture: img ? img.getAttribute('src') : null, errors: errs};
""" % STDERR_MIME


def _explorer(driver):
    return driver.execute_script(JS_EXPLORER, WIDGET_OUT)


def _check_widgets(driver, name):
    """Controls rendered, no widget error; the first slider moved redraws its output."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    text = driver.execute_script(
        "return document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)').textContent")
    assert "Error displaying widget" not in text, f"{name}: Error displaying widget"
    first = _wait(f"{name}: an explorer's slider and its figure",
                  lambda: (lambda e: e if e and e["picture"] else None)(_explorer(driver)), 30.0)
    before, value = first["picture"], first["value"]
    driver.execute_script("""
        const s = document.querySelector(arguments[0] + ' .widget-slider');
        s.closest('.widget-vbox').scrollIntoView({block: 'start'});""", WIDGET_OUT)
    for attempt in range(3):      # a redraw between finding the handle and clicking it
        try:
            handle = driver.find_element(By.CSS_SELECTOR, f"{WIDGET_OUT} .widget-slider "
                                                          ".noUi-handle")
            ActionChains(driver).click(handle).send_keys(Keys.ARROW_RIGHT).perform()
            break
        except StaleElementReferenceException:
            if attempt == 2:
                raise
    _wait(f"{name}: the slider to move from {value}",
          lambda: _explorer(driver)["value"] != value, 10.0)
    moved = _explorer(driver)["value"]
    try:
        _wait(f"{name}: the explorer's figure to change",
              lambda: _explorer(driver)["picture"] not in (None, before), 30.0)
    except AssertionError:
        raise AssertionError(f"{name}: slider moved {value} -> {moved}, the figure did not "
                             f"change; widget output: {_explorer(driver)['errors']}") from None
    errs = _explorer(driver)["errors"]
    assert not errs, f"{name}: the explorer printed an error: {errs}"


# ---------------------------------------------------------------------------------------
# Fast guards on the stored notebooks (no browser)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("nb_path", LABS, ids=[p.stem for p in LABS])
def test_stored_metadata_matches_the_kernel(nb_path):
    """What JupyterLab writes on opening is already stored, so opening is not a change.

    language_info.version is this machine's Python version; `make lab` hands the labs to
    JupyterLab with it (parlab.labserver), so only its presence is checked here.
    """
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    meta = nb["metadata"]
    kernelspec, language_info = kernel_metadata()
    assert meta.get("kernelspec") == kernelspec, (
        f"{nb_path.name}: metadata.kernelspec is {meta.get('kernelspec')}, JupyterLab writes "
        f"{kernelspec}")
    stored = dict(meta.get("language_info", {}))
    assert isinstance(stored.pop("version", None), str), (
        f"{nb_path.name}: metadata.language_info has no version")
    expected = {k: v for k, v in language_info.items() if k != "version"}
    assert stored == expected, (
        f"{nb_path.name}: metadata.language_info is {stored} (version aside), the kernel "
        f"reports {expected}")


@pytest.mark.parametrize("nb_path", LABS, ids=[p.stem for p in LABS])
def test_stored_without_outputs(nb_path):
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{nb_path.name}: cells {dirty} are stored with outputs or counts"


def test_an_explorer_is_there_to_poke():
    assert any(uses_widgets(p) for p in LABS), (
        "no lab uses parlab.widgets any more: the browser test has no explorer to move")


def test_make_lab_opens_labs_with_this_python(tmp_path):
    """`make lab` uses parlab.labserver, which gives a lab this Python's version, file untouched."""
    import asyncio

    pytest.importorskip("jupyter_server")
    from parlab.labserver import LabsContentsManager

    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    lab_line = [line for line in makefile.splitlines() if "jupyter lab" in line]
    assert lab_line and CONTENTS_MANAGER in lab_line[0], (
        f"`make lab` should start JupyterLab with {CONTENTS_MANAGER}: {lab_line}")
    nb = json.loads(LABS[0].read_text(encoding="utf-8"))
    nb["metadata"]["language_info"]["version"] = "3.0.0"
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    (tmp_path / "lab.ipynb").write_text(text, encoding="utf-8")
    model = asyncio.run(LabsContentsManager(root_dir=str(tmp_path)).get("lab.ipynb"))
    _, language_info = kernel_metadata()
    assert model["content"]["metadata"]["language_info"] == language_info
    assert (tmp_path / "lab.ipynb").read_text(encoding="utf-8") == text
