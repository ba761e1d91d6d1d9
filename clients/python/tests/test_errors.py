"""Error mapping: every server reason has its exception, and real failures
arrive as the right class with reason, code and message."""

from __future__ import annotations

import unittest

import grpc

import support
from support import coordd, unique

from coordd.rpc import status_pb2
from coordd.v1 import errors_pb2, lock_pb2, session_pb2


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers


def _details(*msgs: tuple[str, object]) -> tuple:
    st = status_pb2.Status(code=10, message="m")
    for type_name, m in msgs:
        a = st.details.add()
        a.type_url = "type.googleapis.com/" + type_name
        a.value = m.SerializeToString()
    return (("grpc-status-details-bin", st.SerializeToString()),)


class MappingTest(unittest.TestCase):
    def test_every_reason_in_errors_proto_has_a_class(self) -> None:
        reasons = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}
        self.assertEqual(reasons, set(coordd.errors.REASONS))
        for reason, cls in coordd.errors.REASONS.items():
            self.assertTrue(issubclass(cls, coordd.CoorddError))
            self.assertEqual(cls.REASON, reason)
            self.assertIs(getattr(coordd, cls.__name__), cls)

    def test_decodes_error_info_bad_request_retry_info(self) -> None:
        trailers = _details(
            ("google.rpc.ErrorInfo", status_pb2.ErrorInfo(reason="RATE_LIMITED", domain="coordd")),
            ("google.rpc.RetryInfo", status_pb2.RetryInfo(retry_delay={"seconds": 1, "nanos": 500_000_000})),
            ("google.rpc.BadRequest", status_pb2.BadRequest(field_violations=[{"field": "k", "description": "bad"}])),
        )
        e = coordd.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", trailers))
        self.assertIsInstance(e, coordd.RateLimited)
        self.assertEqual((e.reason, e.code, e.message, e.retry_after), ("RATE_LIMITED", grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", 1.5))
        self.assertEqual(e.problems, (coordd.errors.Problem("k", "bad"),))

    def test_other_domains_and_missing_details_fall_back_to_the_code(self) -> None:
        other = _details(("google.rpc.ErrorInfo", status_pb2.ErrorInfo(reason="LOCK_HELD", domain="example.com")))
        e = coordd.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down", other))
        self.assertIsInstance(e, coordd.Unavailable)
        self.assertEqual(e.reason, "UNAVAILABLE")
        e = coordd.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.DATA_LOSS, "?"))
        self.assertIs(type(e), coordd.CoorddError)
        self.assertEqual(e.reason, "")


class ServerErrorsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = support.client()
        self.addCleanup(self.client.close)

    def test_invalid_lock_name(self) -> None:
        s = self.client.session(ttl=3)
        self.addCleanup(s.close)
        with self.assertRaises(coordd.InvalidArgument) as cm:
            s.try_lock("bad name!")
        e = cm.exception
        self.assertEqual((e.reason, e.code), ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT))
        self.assertIn("bad name!", e.message)

    def test_invalid_ttl(self) -> None:
        with self.assertRaises(coordd.InvalidArgument) as cm:
            self.client.session(ttl=1)
        self.assertIn("ttl", cm.exception.message)

    def test_not_found_reasons(self) -> None:
        with self.assertRaises(coordd.NoLeader) as cm:
            self.client.leader(unique("nobody"))
        self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(coordd.KeyNotFound):
            self.client.kv.get(unique("missing"))
        s = self.client.session(ttl=3)
        s.close()
        with self.assertRaises(coordd.SessionNotFound):
            self.client._unary("sessions", "KeepAlive", session_pb2.KeepAliveRequest(session_id=s.id))
        with self.assertRaises(coordd.SessionClosed):
            s.try_lock(unique("closed"))  # refused locally: the session has ended

    def test_not_holder_after_release(self) -> None:
        s = self.client.session(ttl=3)
        self.addCleanup(s.close)
        held = s.try_lock(unique("nh"))
        held.release()
        with self.assertRaises(coordd.NotHolder) as cm:
            self.client._unary("locks", "Release", lock_pb2.ReleaseRequest(name=held.name, token=held.token))
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)

    def test_validation_failed_lists_problems(self) -> None:
        ns = unique("schema").replace("pytest/", "pytest-")
        self.client.config.set_schema(ns, '{"type":"object","properties":{"port":{"type":"integer"}}}')
        self.assertIn("integer", self.client.config.schema(ns))
        with self.assertRaises(coordd.ValidationFailed) as cm:
            self.client.config.publish(ns, {"port": "not-a-number"})
        self.assertIsInstance(cm.exception, coordd.InvalidArgument)
        self.assertTrue(cm.exception.problems, "the schema violations are listed")
        self.assertTrue(any("port" in p.key or "port" in p.description for p in cm.exception.problems), cm.exception.problems)
        self.client.config.publish(ns, {"port": "8080"})


if __name__ == "__main__":
    unittest.main()
