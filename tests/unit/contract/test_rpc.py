"""A failed call becomes the contract's error: its type from the status code, Unreachable only
when the server did not answer, and a message that names the call when one is given."""

from __future__ import annotations

import grpc
import pytest

from strata.contract.errors import ANSWERED, DeadlineExceeded, NotFound, StrataError, Unavailable, Unreachable
from strata.contract.rpc import NO_ANSWER, call_metadata, error_of


class Failed(grpc.RpcError):  # type: ignore[misc]
    """A failed call as a client sees it."""

    def __init__(self, code: grpc.StatusCode, details: str, *, answered: bool = False) -> None:
        self._code, self._details, self._answered = code, details, answered

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ANSWERED if self._answered else ()


U, D, N, C = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.CANCELLED)


@pytest.mark.parametrize(
    ("failed", "what", "error", "message"),
    [
        (Failed(U, "connection refused"), "stat /a", Unreachable, "stat /a: connection refused"),
        (Failed(D, "Deadline Exceeded"), "stat /a", Unreachable, "stat /a: timed out (Deadline Exceeded)"),
        (Failed(U, "store down", answered=True), "stat /a", Unavailable, "stat /a: store down"),
        (Failed(D, "store slow", answered=True), "stat /a", DeadlineExceeded, "stat /a: timed out (store slow)"),
        (Failed(N, "no file /a", answered=True), "stat /a", NotFound, "no file /a"),
        (Failed(N, ""), "stat /a", NotFound, "stat /a failed"),
        # Without `what`, the server's details stand alone (or the code's name).
        (Failed(U, "connection refused"), "", Unreachable, "connection refused"),
        (Failed(D, ""), "", Unreachable, "DEADLINE_EXCEEDED"),
        (Failed(N, ""), "", NotFound, "NOT_FOUND"),
        # CANCELLED is a server's answer of no known type unless the caller counts it as none.
        (Failed(C, "cancelled"), "", StrataError, "cancelled"),
    ],
)
def test_a_failed_call_becomes_its_error(failed: Failed, what: str, error: type, message: str) -> None:
    got = error_of(failed, what)
    assert type(got) is error and str(got) == message


def test_a_caller_names_the_codes_that_mean_no_answer() -> None:
    assert type(error_of(Failed(C, "closed"), no_answer=(*NO_ANSWER, C))) is Unreachable
    assert type(error_of(Failed(C, "closed", answered=True), no_answer=(*NO_ANSWER, C))) is StrataError


def test_the_token_travels_as_a_bearer_credential() -> None:
    assert call_metadata("t0k") == (("authorization", "Bearer t0k"),)
