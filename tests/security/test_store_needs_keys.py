"""The embedded stack serves the bucket only to a client with the S3 keys.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway, each listening on loopback; any
local user (or a run's task code) can connect. Every port the stack's processes listen on (read from
/proc, not from the ports the stack asked for) is asked, without keys, for a stored object and to write
one; none answers with the object's bytes, and no write lands (checked with the keys afterwards).
"""

from __future__ import annotations

import http.client
import json
import os
import uuid

from activities.object_store import ObjectStore
from workers.stack import EmbeddedStack


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on."""
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            sockets.add(target.removeprefix("socket:[").removesuffix("]"))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state, inode = line.split()[1], line.split()[3], line.split()[9]
            if state == "0A" and inode in sockets:  # 0A: LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def ask(port: int, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, bytes]:
    """An unauthenticated HTTP request: (status, body); (0, b"") when the port does not speak HTTP."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def multipart(data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'.encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_no_port_of_the_stack_serves_or_takes_the_bucket_without_keys(stack: EmbeddedStack) -> None:
    state = stack.running()
    store = ObjectStore(stack.s3_settings)
    bucket = store.bucket
    tag = uuid.uuid4().hex
    payload = f"stored-payload-{tag}".encode()
    key = f"keys-probe-{tag}/object.bin"
    store.put_bytes(key, payload)
    ports = listening_ports(state.seaweed.pid) | listening_ports(state.temporal.pid)
    assert {state.s3_port, *state.weed_ports.values()} <= ports  # the scan sees every part weed started

    intruder = f"intruder-{tag}".encode()
    for port in sorted(ports):
        for path in (f"/{bucket}/{key}", f"/buckets/{bucket}/{key}", f"/buckets/{bucket}/keys-probe-{tag}/"):
            status, body = ask(port, "GET", path)
            assert payload not in body, (port, path, status)
        for method in ("PUT", "POST"):
            for path in (f"/{bucket}/{key}", f"/buckets/{bucket}/{key}", f"/buckets/{bucket}/written-{tag}"):
                form, content_type = multipart(intruder)
                ask(port, method, path, form, **{"Content-Type": content_type})
                ask(port, method, path, intruder)

    # the master hands out file ids to anyone; the volume server must still refuse to store under one
    status, body = ask(state.weed_ports["master.port"], "GET", "/dir/assign")
    if status == 200:
        fid = json.loads(body)["fid"]
        form, content_type = multipart(intruder)
        written, _ = ask(
            state.weed_ports["volume.port"], "POST", f"/{fid}", form, **{"Content-Type": content_type}
        )
        assert not 200 <= written < 300, written
        assert intruder not in ask(state.weed_ports["volume.port"], "GET", f"/{fid}")[1]

    # with the keys: the object is intact and nothing else was written
    assert store.get_bytes(key) == payload
    assert [k for k in store.list("") if tag in k] == [key]
