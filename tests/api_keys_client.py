"""Run by tests/openai_client.rs: the official `openai` package against a `suffixd serve`
behind API keys (SUFFIXD_API_KEY and an --api-keys file with two tenants' keys). Every
check raises on failure; the last line printed is "all checks passed".

    target/py/bin/python tests/api_keys_client.py --base-url URL \
        --open-key K --tenant-key K_B --other-tenant-key K_C
"""
import argparse

import openai
from openai import OpenAI

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", required=True)
parser.add_argument("--open-key", required=True)
parser.add_argument("--tenant-key", required=True)
parser.add_argument("--other-tenant-key", required=True)
args = parser.parse_args()


def client(key, **kwargs):
    return OpenAI(base_url=args.base_url, api_key=key, max_retries=0, **kwargs)


def refused(call, error, code=None):
    """`call` raises the openai package's `error` (with `code`, when given)."""
    try:
        call()
    except error as e:
        if code is not None and e.code != code:
            raise AssertionError(f"{error.__name__} with code {e.code!r}, not {code!r}")
        return e
    raise AssertionError(f"expected {error.__name__}")


open_client = client(args.open_key)
model = open_client.models.list().data[0].id
messages = [{"role": "user", "content": "Say hi."}]

# The client's default path with a wrong key: OpenAI's 401, which the package raises as
# AuthenticationError (code invalid_api_key), before any work.
wrong = client(args.open_key[:-1] + "x")
refused(lambda: wrong.models.list(), openai.AuthenticationError, "invalid_api_key")
refused(
    lambda: wrong.chat.completions.create(model=model, messages=messages, max_tokens=4),
    openai.AuthenticationError,
    "invalid_api_key",
)
print("a wrong key: AuthenticationError (invalid_api_key)")

# The right keys: chat, streamed too.
for key in (args.open_key, args.tenant_key):
    answer = client(key).chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content, answer
streamed = client(args.tenant_key).chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, stream=True
)
text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
assert text == answer.choices[0].message.content, (text, answer)
print("the open key and a tenant's key: answered, streamed alike")

# A tenant's key naming another namespace: 403, PermissionDeniedError.
elsewhere = client(args.tenant_key, default_headers={"x-suffixd-namespace": "team-c"})
refused(
    lambda: elsewhere.chat.completions.create(model=model, messages=messages, max_tokens=4),
    openai.PermissionDeniedError,
)
print("a tenant's key naming another namespace: PermissionDeniedError")

# Stored responses are the tenant's own: the other tenant finds nothing (404, as an
# unknown id), and cannot continue or delete it; the open key reads any.
tenant, other = client(args.tenant_key), client(args.other_tenant_key)
made = tenant.responses.create(model=model, input="Say hi.", max_output_tokens=8)
assert tenant.responses.retrieve(made.id).id == made.id
assert open_client.responses.retrieve(made.id).id == made.id
refused(lambda: other.responses.retrieve(made.id), openai.NotFoundError)
refused(lambda: other.responses.input_items.list(made.id), openai.NotFoundError)
refused(
    lambda: other.responses.create(
        model=model, input="Go on.", previous_response_id=made.id, max_output_tokens=4
    ),
    openai.BadRequestError,
    "previous_response_not_found",
)
refused(lambda: other.responses.delete(made.id), openai.NotFoundError)
went_on = tenant.responses.create(
    model=model, input="Go on.", previous_response_id=made.id, max_output_tokens=4
)
assert went_on.previous_response_id == made.id
tenant.responses.delete(made.id)
refused(lambda: tenant.responses.retrieve(made.id), openai.NotFoundError)
print("stored responses: the tenant's own; another tenant gets not found")

print("all checks passed")
