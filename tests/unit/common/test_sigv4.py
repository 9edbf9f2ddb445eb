"""The SigV4 signer (`corral_common.sigv4`, the S3 archive's) against AWS's published
examples: the Signature Version 4 test suite (get-vanilla, get-vanilla-query-order-key-case,
post-vanilla) and the Amazon S3 API Reference's "Signature Calculations for the Authorization
Header" (GET Object, PUT Object, GET Bucket lifecycle, GET Bucket). A single wrong byte in the
canonical request changes them."""

from __future__ import annotations

import pytest

from corral_common import sigv4

SUITE = sigv4.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SUITE_DATE = "20150830T123600Z"
S3_DOC = sigv4.Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
S3_DATE = "20130524T000000Z"
S3_HOST = "examplebucket.s3.amazonaws.com"
WELCOME = sigv4.sha256_hex(b"Welcome to Amazon S3.")


@pytest.mark.parametrize(
    ("method", "params", "signature"),
    [
        ("GET", [], "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        ("GET", [("Param2", "value2"), ("Param1", "value1")],
         "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
        ("POST", [], "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
    ],
    ids=["get-vanilla", "get-vanilla-query-order-key-case", "post-vanilla"],
)  # fmt: skip
def test_the_signature_v4_test_suite(
    method: str, params: list[tuple[str, str]], signature: str
) -> None:
    headers = {"Host": "example.amazonaws.com", "X-Amz-Date": SUITE_DATE}
    got = sigv4.authorization(
        method, "/", params, headers, sigv4.EMPTY_SHA256,
        credentials=SUITE, region="us-east-1", service="service", amz_date=SUITE_DATE,
    )  # fmt: skip
    assert got == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={signature}"
    )


def _s3(method: str, path: str, params: list[tuple[str, str]], extra: dict[str, str],
        payload: str) -> str:  # fmt: skip
    headers = {"host": S3_HOST, "x-amz-date": S3_DATE, "x-amz-content-sha256": payload, **extra}
    return sigv4.authorization(
        method, path, params, headers, payload,
        credentials=S3_DOC, region="us-east-1", service="s3", amz_date=S3_DATE,
    )  # fmt: skip


def test_the_s3_get_object_example_with_its_canonical_request() -> None:
    headers = {"host": S3_HOST, "range": "bytes=0-9", "x-amz-content-sha256": sigv4.EMPTY_SHA256,
               "x-amz-date": S3_DATE}  # fmt: skip
    request, signed = sigv4.canonical_request("GET", "/test.txt", [], headers, sigv4.EMPTY_SHA256)
    assert signed == "host;range;x-amz-content-sha256;x-amz-date"
    # The canonical request's hash is the last line of the document's string to sign.
    assert sigv4.sha256_hex(request.encode()) == (
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    )
    got = _s3("GET", "/test.txt", [], {"range": "bytes=0-9"}, sigv4.EMPTY_SHA256)
    assert got == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_the_s3_put_object_example_encodes_the_key_once() -> None:
    assert WELCOME == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
    path = "/" + sigv4.uri_encode("test$file.text", keep_slash=True)
    assert path == "/test%24file.text"
    extra = {"date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY"}
    got = _s3("PUT", path, [], extra, WELCOME)
    assert got.endswith("98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")
    assert "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class," in got


@pytest.mark.parametrize(
    ("params", "signature"),
    [
        ([("lifecycle", "")], "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        ([("prefix", "J"), ("max-keys", "2")],
         "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
    ],
    ids=["get-bucket-lifecycle", "list-objects-params-out-of-order"],
)  # fmt: skip
def test_the_s3_bucket_examples(params: list[tuple[str, str]], signature: str) -> None:
    assert _s3("GET", "/", params, {}, sigv4.EMPTY_SHA256).endswith(f"Signature={signature}")


def test_uri_encoding_is_rfc3986_with_upper_case_hex() -> None:
    assert sigv4.uri_encode("a b/é+~", keep_slash=True) == "a%20b/%C3%A9%2B~"
    assert sigv4.uri_encode("a/b", keep_slash=False) == "a%2Fb"
    assert sigv4.canonical_query([("b", "2"), ("a", "x y"), ("a", "1")]) == "a=1&a=x%20y&b=2"


def test_credentials_never_show_the_secret() -> None:
    assert "wJalr" not in repr(SUITE) and "AKIDEXAMPLE" in repr(SUITE)
