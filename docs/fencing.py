"""fencing.py: the small sequential model the project's requirements start from.

Run it with `python3 docs/fencing.py` (standard library only). It checks only the
comparison rule: no persistence, no atomic transactions, no issuer authorisation, no
partition recovery, no network timing (S16 in docs/requirements.md). Passing it proves
nothing about a distributed deployment. The same scenario runs against the real system
in crates/cli/tests/fencing_scenario.rs, crates/adapters/tests/ and the checkers'
tests.
"""


class StaleFenceError(RuntimeError):
    pass


class FencingResource:
    """Sequential model: equal tokens permit more writes in the same epoch."""

    def __init__(self):
        self.last_seen = 0
        self.data = None

    def write(self, token, value):
        if type(token) is not int or token <= 0:
            raise StaleFenceError("missing or invalid fence token")
        if token < self.last_seen:
            raise StaleFenceError(f"stale token {token} < {self.last_seen}")
        self.last_seen = token
        self.data = value
        return True


class Issuer:
    """Test counter; a real issuer must bind durable epochs to ownership."""

    def __init__(self):
        self.counter = 0

    def acquire(self):
        self.counter += 1
        return self.counter


def refused(resource, token):
    before = (resource.last_seen, resource.data)
    try:
        resource.write(token, "must-not-land")
    except StaleFenceError as error:
        assert (resource.last_seen, resource.data) == before
        print("rejected:", error)
    else:
        raise AssertionError("invalid or stale write was accepted")


issuer = Issuer()
old_leader, new_leader = issuer.acquire(), issuer.acquire()
resource = FencingResource()
# Issuance alone has not informed this resource about epoch 2.
assert resource.write(old_leader, "arrived-before-new-epoch")
assert resource.write(new_leader, "from-new-leader")
refused(resource, old_leader)
assert resource.write(new_leader, "second-write-in-same-epoch")
assert resource.last_seen == 2
refused(resource, None)
refused(resource, "2")
refused(resource, True)
next_token = issuer.acquire()
assert resource.write(next_token, "newest")
refused(resource, new_leader)
assert (resource.last_seen, resource.data) == (3, "newest")
print("PASS: observed newer epochs fence older writes; equal epoch remains usable")
