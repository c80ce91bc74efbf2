"""Drives the dashboard in headless Chromium against a live `palisade serve` with an auth
file, and asserts on the rendered page. Run by scripts/ui-test, which installs what it
needs: `python ui_test.py PALISADE_BINARY SCREENSHOT_PATH`.

The page gets the key of a read-only principal ("dash"); a second one ("app") acquires
and writes through the API: a grant, a fenced write, a stale write (refused), a gate's
report of the same stale writer refused in PostgreSQL, the gates' marks beside the
store's, a lease left to expire, then
enough locks for a second page. Every check polls the page until it
shows the state or the deadline passes; nothing sleeps a fixed time.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

DEADLINE_S = 20


def new_key(palisade):
    """A key and its auth-file line, from `palisade auth new-key`."""
    out = subprocess.run(
        [palisade, "auth", "new-key"], capture_output=True, text=True, check=True
    ).stdout
    key = next(l for l in out.splitlines() if l.startswith("key: "))[5:].strip()
    line = next(l for l in out.splitlines() if l.startswith("key_sha256"))
    assert hashlib.sha256(key.encode()).hexdigest() in line, out
    return key, line


def start_server(palisade, work):
    dash, dash_line = new_key(palisade)
    app, app_line = new_key(palisade)
    auth = os.path.join(work, "auth.toml")
    with open(auth, "w") as f:
        f.write(
            f'[[principal]]\nname = "dash"\n{dash_line}\n'
            '[[principal.grant]]\nlocks = "*"\nallow = ["read", "metrics"]\n\n'
            f'[[principal]]\nname = "app"\n{app_line}\n'
            '[[principal.grant]]\nlocks = "*"\nallow = ["acquire", "read", "write"]\n'
        )
    out = open(os.path.join(work, "server.out"), "w+")
    err = open(os.path.join(work, "server.err"), "w")
    server = subprocess.Popen(
        [palisade, "serve", "--listen", "127.0.0.1:0", "--data-dir",
         os.path.join(work, "data"), "--auth-file", auth],
        stdout=out, stderr=err,
    )
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        out.seek(0)
        for line in out.read().splitlines():
            if line.startswith("palisade listening on "):
                return server, line.split()[-1], dash, app
        if server.poll() is not None:
            break
        time.sleep(0.05)
    server.kill()
    sys.exit("ui-test: the server did not start: " + open(err.name).read())


class Api:
    def __init__(self, base, key):
        self.base, self.key = base, key

    def call(self, method, path, body=None, headers=None):
        data = body.encode() if isinstance(body, str) else (
            json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.key)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def acquire(self, lock, ttl_ms, label="w1"):
        status, body = self.call("POST", f"/v1/locks/{lock}/acquire",
                                 {"holder": label, "ttl_ms": ttl_ms})
        assert status == 200, (lock, status, body)
        return body

    def put(self, lock, key, token, value):
        return self.call("PUT", f"/v1/kv/{lock}/{key}", value, {"Fencing-Token": token})


def main():
    palisade, screenshot = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="palisade-ui-")
    server, base, dash_key, app_key = start_server(palisade, work)
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1400,900",
                f"--user-data-dir={work}/profile"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(
        options=options,
        service=Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")),
    )
    try:
        run(driver, base, dash_key, Api(base, app_key), screenshot)
        print("ui-test: every check passed")
    except BaseException:
        driver.save_screenshot(screenshot)  # the page as it was when a check failed
        raise
    finally:
        print(f"ui-test: screenshot {screenshot}")
        driver.quit()
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def wait_for(driver, what, check):
    """Polls `check(driver)` until it returns something true; fails naming `what`."""
    def attempt(d):
        try:
            return check(d)
        except Exception:  # the element is not there yet, or was replaced mid-read
            return False
    try:
        return WebDriverWait(driver, DEADLINE_S, poll_frequency=0.1).until(attempt)
    except Exception:
        feed = driver.find_element(By.ID, "feed").text
        status = driver.find_element(By.ID, "status").text
        sys.exit(f"ui-test: the page never showed {what} (status {status!r}; feed:\n{feed})")


def cells(driver, table, attr, name):
    row = driver.find_element(By.CSS_SELECTOR, f"#{table} tr[data-{attr}='{name}']")
    return {td.get_attribute("class").split()[0]: td.text for td in row.find_elements(By.TAG_NAME, "td")}


def feed_entry(driver, kind, lock, text=""):
    for li in driver.find_elements(By.CSS_SELECTOR, f"#feed li[data-type='{kind}'][data-lock='{lock}']"):
        if text in li.text:
            return li
    return None


def run(driver, base, dash_key, app, screenshot):
    driver.get(base + "/ui")
    wait_for(driver, "a request for the key", lambda d: "key" in d.find_element(By.ID, "status").text)
    driver.find_element(By.ID, "key").send_keys(dash_key)
    driver.find_element(By.ID, "key-use").click()
    wait_for(driver, "the data with the key", lambda d: d.find_element(By.ID, "status").text.startswith("updated"))
    stored = driver.execute_script("return [sessionStorage.getItem('palisade.key'), localStorage.length]")
    assert stored == [dash_key, 0], stored
    wait_for(driver, "the live feed", lambda d: d.find_element(By.ID, "feed-state").text == "(live)")

    # A grant, then a fenced write under it.
    first = app.acquire("orders", 60_000)
    wait_for(driver, "the grant's row", lambda d: (c := cells(d, "locks", "lock", "orders"))
             and c["holder"] == "app/w1" and c["epoch"] == "1" and c["waiters"] == "0")
    wait_for(driver, "the granted event", lambda d: feed_entry(d, "granted", "orders", "epoch 1"))
    status, body = app.put("orders", "k", first["token"], "one")
    assert status == 200, body
    wait_for(driver, "the namespace's mark", lambda d: (c := cells(d, "namespaces", "ns", "orders"))
             and c["hw"] == "1" and c["keys"] == "1")
    wait_for(driver, "the fenced event", lambda d: feed_entry(d, "fenced", "orders", "high-water 1"))

    # A newer holder writes; the old token's write is refused and highlighted.
    status, body = app.call("POST", f"/v1/leases/{first['lease_id']}/release")
    assert status == 200, body
    second = app.acquire("orders", 60_000, "w2")
    status, body = app.put("orders", "k", second["token"], "two")
    assert status == 200, body
    status, body = app.put("orders", "k", first["token"], "stale")
    assert status == 409 and body["error"]["code"] == "stale_token", body
    wait_for(driver, "the new holder", lambda d: (c := cells(d, "locks", "lock", "orders"))
             and c["holder"] == "app/w2" and c["epoch"] == "2")
    wait_for(driver, "the mark at epoch 2", lambda d: cells(d, "namespaces", "ns", "orders")["hw"] == "2")
    rejected = wait_for(driver, "the rejection", lambda d: feed_entry(d, "rejected", "orders", "stale_token"))
    assert "epoch 1 < high-water 2" in rejected.text, rejected.text
    colour = rejected.value_of_css_property("background-color")
    plain = feed_entry(driver, "granted", "orders", "epoch 2").value_of_css_property("background-color")
    assert colour != plain, (colour, plain)

    # A gate inside PostgreSQL refused the same stale writer and reported it: the feed
    # shows it, highlighted like the store's own refusal.
    status, body = app.call("POST", "/v1/gates/report", {
        "resource": "postgres", "admitted": 3, "refused": {"stale_token": 1},
        "recent": [{"lock": "orders", "code": "stale_token", "epoch": 1, "high_water": 2}]})
    assert status == 200 and body == {"published": 1, "dropped": 0}, (status, body)
    refused = wait_for(driver, "the gate's refusal",
                       lambda d: feed_entry(d, "gate_refused", "orders", "REFUSED by the postgres gate"))
    assert "stale_token epoch 1 < high-water 2" in refused.text, refused.text
    assert refused.value_of_css_property("background-color") == colour

    # The marks by resource: the PostgreSQL gate has seen epoch 2, like the store; a Redis
    # gate reports it has only seen epoch 1, and is shown behind.
    for resource, mark in (("postgres", 2), ("redis", 1)):
        status, body = app.call("POST", "/v1/gates/report", {
            "resource": resource, "marks": [{"lock": "orders", "high_water": mark}]})
        assert status == 200, (status, body)
    wait_for(driver, "the marks by resource", lambda d: cells(d, "marks", "lock", "orders")
             == {"lock": "orders", "store": "2", "resources": "postgres 2 redis 1"})
    behind = [s.get_attribute("data-resource") for s in
              driver.find_elements(By.CSS_SELECTOR, "#marks tr[data-lock='orders'] span.behind")]
    assert behind == ["redis"], behind

    # A lease left to lapse.
    app.acquire("jobs", 300)
    wait_for(driver, "the expiry", lambda d: feed_entry(d, "expired", "jobs", "epoch 1"))
    wait_for(driver, "the lapsed lock freed", lambda d: cells(d, "locks", "lock", "jobs")["holder"] == "-")

    # The chart: the stale write's second shows as a red point above the zero line.
    wait_for(driver, "rejections on the chart", lambda d: d.execute_script(
        "const c = document.getElementById('chart');"
        "const px = c.getContext('2d').getImageData(0, 0, c.width, c.height - 8).data;"
        "for (let i = 0; i < px.length; i += 4)"
        "  if (px[i] > 150 && px[i + 1] < 90 && px[i + 2] < 90 && px[i + 3] > 200) return true;"
        "return false;"))

    # Twenty locks: everything still on the first screen (1400x900), and the chart has
    # its time axis.
    for i in range(18):
        app.acquire(f"fill-{i:02}", 60_000)
    wait_for(driver, "twenty locks", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#locks tbody tr")) == 20)
    outside = driver.execute_script(
        "return ['locks-section', 'namespaces-section', 'marks-section', 'chart-section', 'feed-section']"
        ".filter(id => { const r = document.getElementById(id).getBoundingClientRect();"
        "  return r.bottom > window.innerHeight || r.right > window.innerWidth; });")
    assert outside == [], f"not on the first screen at 1400x900: {outside}"
    axis = driver.execute_script(
        "const c = document.getElementById('chart');"
        "const px = c.getContext('2d').getImageData(0, c.height - 12, c.width, 12).data;"
        "let ink = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 100) ink++;"
        "return ink;")
    assert axis > 50, f"no time axis under the chart ({axis} pixels of ink)"

    driver.save_screenshot(screenshot)  # the sequence above, on one screen

    # Opened again, the page shows what just happened at once (the events' backlog), with
    # nothing new happening meanwhile.
    driver.refresh()
    wait_for(driver, "the rejection, from the backlog",
             lambda d: feed_entry(d, "rejected", "orders", "stale_token"))
    wait_for(driver, "the expiry, from the backlog",
             lambda d: feed_entry(d, "expired", "jobs", "epoch 1"))

    # A page at a time: 37 more locks (57 in all) make the table a first page of 50 and a
    # second of 7.
    for i in range(37):
        app.acquire(f"bulk-{i:03}", 60_000)
    wait_for(driver, "a full first page", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#locks tbody tr")) == 50
             and d.find_element(By.ID, "locks-next").is_enabled())
    driver.find_element(By.ID, "locks-next").click()
    wait_for(driver, "the second page", lambda d: d.find_element(By.ID, "locks-page").text == "page 2"
             and cells(d, "locks", "lock", "orders")["epoch"] == "2"
             and len(d.find_elements(By.CSS_SELECTOR, "#locks tbody tr")) == 7)
    driver.find_element(By.ID, "locks-prev").click()
    wait_for(driver, "the first page again", lambda d: d.find_element(By.ID, "locks-page").text == "page 1")


if __name__ == "__main__":
    main()
