"""The embedded stack serves the bucket only to a client with the S3 keys.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway, each listening on loopback; any
local user (or a run's task code) can connect. Every port the stack's processes listen on (read from
/proc, not from the ports the stack asked for) is asked, without keys, for a stored object and to write
one; none answers with the object's bytes, and no write lands (checked with the keys afterwards).

weed's gRPC ports (the filer's would list, read and write the bucket's files) are called the same way: every
port refuses a client with no TLS, with TLS but no certificate, or with a certificate another CA signed; with
the stack's client certificate each gRPC server answers, so the refusals are the certificate's doing.
"""

from __future__ import annotations

import http.client
import json
import os
import uuid
from pathlib import Path

import grpc

from activities.object_store import ObjectStore
from workers.stack import WEED_PORT_FLAGS, EmbeddedStack
from workers.weed_security import GrpcTlsFiles, grpc_tls_files, write_weed_security


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


def pb_strings(*values: str) -> bytes:
    """A protobuf message whose fields 1, 2, ... are these strings (each under 128 bytes)."""
    out = b""
    for number, value in enumerate(values, start=1):
        data = value.encode()
        assert len(data) < 128
        out += bytes([number << 3 | 2, len(data)]) + data
    return out


def grpc_call(
    port: int, method: str, request: bytes, tls: GrpcTlsFiles | None, cert: GrpcTlsFiles | None
) -> tuple[grpc.StatusCode, bytes]:
    """A unary gRPC call: (status, reply). ``tls``: the CA the client trusts (None: no TLS); ``cert``: the
    certificate and key it presents (None: none)."""
    address = f"127.0.0.1:{port}"
    if tls is None:
        channel = grpc.insecure_channel(address)
    else:
        key, chain = (None, None) if cert is None else (cert.key.read_bytes(), cert.cert.read_bytes())
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(tls.ca.read_bytes(), key, chain))
    with channel:
        try:
            return grpc.StatusCode.OK, channel.unary_unary(method)(request, timeout=10)
        except grpc.RpcError as err:
            return err.code(), b""


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


def test_no_grpc_port_of_the_store_lets_in_a_client_without_the_stacks_certificate(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    state = stack.running()
    store = ObjectStore(stack.s3_settings)
    tag = uuid.uuid4().hex
    store.put_bytes(f"grpc-probe-{tag}/object.bin", b"stored")
    unknown = "/dgrpo.Probe/Nothing"  # a server that lets a client in answers UNIMPLEMENTED
    code = grpc.StatusCode
    probes = {  # a call to each gRPC server, and its answer to a client with the stack's certificate
        "master.port.grpc": ("/master_pb.Seaweed/GetMasterConfiguration", b"", code.OK),
        "volume.port.grpc": ("/volume_server_pb.VolumeServer/VolumeServerStatus", b"", code.OK),
        "filer.port.grpc": (
            "/filer_pb.SeaweedFiler/LookupDirectoryEntry",
            pb_strings(f"/buckets/{store.bucket}/grpc-probe-{tag}", "object.bin"),
            code.OK,
        ),
        # the S3 gateway's IAM calls also need a JWT signed with weed's filer key: refused, but by the server
        "s3.port.grpc": ("/messaging_pb.SeaweedS3IamCache/ListPolicies", b"", code.UNAUTHENTICATED),
        "admin.port.grpc": (unknown, b"", code.UNIMPLEMENTED),  # the admin server has no unary call
    }
    assert set(probes) == {flag for flag in WEED_PORT_FLAGS if flag.endswith(".grpc")}
    ours = stack.weed_grpc_client()
    write_weed_security(tmp_path)  # an intruder's CA and certificates, made the way the stack makes its own
    theirs = grpc_tls_files(tmp_path)
    strangers = {
        "no TLS": (None, None),
        "no certificate": (ours, None),
        "another CA's certificate": (ours, theirs),
    }

    flag_of = {port: flag for flag, port in state.weed_ports.items()}
    ports = listening_ports(state.seaweed.pid)
    assert {state.weed_ports[flag] for flag in probes} <= ports
    for port in sorted(ports):  # every port weed listens on, not only those the stack named
        method, request, _ = probes.get(flag_of.get(port, ""), (unknown, b"", code.UNIMPLEMENTED))
        for who, (tls, cert) in strangers.items():
            status, _ = grpc_call(port, method, request, tls, cert)
            assert status == code.UNAVAILABLE, (flag_of.get(port, port), who, status)

    for flag, (method, request, answer) in probes.items():
        status, reply = grpc_call(state.weed_ports[flag], method, request, ours, ours)
        assert status == answer, (flag, status)
        if flag == "filer.port.grpc":
            assert b"object.bin" in reply  # with the certificate the filer serves the bucket's files
