"""An OAuth-authorizing MCP client (the official Python SDK's `OAuthClientProvider`) for
toolwall's tests of protected MCP servers, headless.

usage: mcp_oauth_client.py URL [--call TOOL [--args JSON]]... [--client-name NAME]

Connects to the Streamable HTTP endpoint URL with an empty in-memory token store, so the first
request is answered 401 and the SDK runs the whole flow (protected resource metadata, authorization
server metadata, dynamic registration, authorization code with PKCE, token). No browser: the
authorization URL is fetched without following its redirect, and the code, state and iss are
taken from the `Location` the authorization server answers with (an authorization server that
asks a person to consent cannot be used). Then lists the tools (all pages) and calls each
`--call TOOL` with its `--args` object (default `{}`).

Prints one JSON object on stdout:
  {"ok": true|false, "url": URL, "tools": [names], "calls": [{"name", "result"} | {"name", "error"}],
   "http": [{"method", "url", "status"}], "error": message (only when not ok)}
`http` lists every HTTP exchange this client made, in order, with the query left off the URL:
the MCP requests, the flow's metadata, registration and token requests, and the authorization
request. A tool call answered with a JSON-RPC error is a result, not a failure. Exits 1, with the
report and the reason on stderr, if connecting, authorizing or listing fails; 2 on bad usage.
"""

import asyncio
import json
import sys
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx2
from mcp import ClientSession
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

# Never listened on: the authorization server's redirect to it is read, not followed.
REDIRECT_URI = "http://localhost:3000/callback"

USAGE = "usage: mcp_oauth_client.py URL [--call TOOL [--args JSON]]... [--client-name NAME]"


class MemoryStorage:
    """Tokens and the registered client, for this process only."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def without_query(url) -> str:
    # Authorization requests and redirects carry codes and state in the query: keep them out of
    # the report.
    parts = urlsplit(str(url))
    return urlunsplit(parts._replace(query="", fragment=""))


class Headless:
    """The user agent's part of the authorization code flow, without a user agent."""

    def __init__(self, http):
        self.http = http
        self.result = None

    async def redirect(self, authorization_url: str) -> None:
        self.result = None
        async with httpx2.AsyncClient(
            follow_redirects=False, event_hooks={"response": [self.http.hook]}
        ) as client:
            response = await client.get(authorization_url)
        location = response.headers.get("location")
        if response.status_code not in (301, 302, 303, 307, 308) or not location:
            raise RuntimeError(
                f"the authorization endpoint answered HTTP {response.status_code} without a redirect "
                f"(it may want a person to consent): {response.text[:300]!r}"
            )
        query = parse_qs(urlsplit(location).query)
        if "error" in query:
            raise RuntimeError(
                f"the authorization server refused: {query['error'][0]} {query.get('error_description', [''])[0]}"
            )
        if "code" not in query:
            raise RuntimeError(f"no code in the authorization redirect to {without_query(location)}")

        def one(name):
            return query[name][0] if name in query else None

        self.result = AuthorizationCodeResult(code=one("code"), state=one("state"), iss=one("iss"))

    async def callback(self) -> AuthorizationCodeResult:
        if self.result is None:
            raise RuntimeError("no authorization code: the redirect handler did not get one")
        return self.result


class HttpLog:
    def __init__(self):
        self.exchanges = []

    async def hook(self, response: httpx2.Response) -> None:
        request = response.request
        self.exchanges.append(
            {"method": request.method, "url": without_query(request.url), "status": response.status_code}
        )


def parse_args(argv):
    if not argv or argv[0].startswith("-"):
        raise ValueError("the URL comes first")
    url, calls, client_name = argv[0], [], "toolwall-test-oauth-client"
    i = 1
    while i < len(argv):
        flag = argv[i]
        if i + 1 >= len(argv):
            raise ValueError(f"{flag} needs a value")
        value = argv[i + 1]
        if flag == "--call":
            calls.append([value, {}])
        elif flag == "--args":
            if not calls:
                raise ValueError("--args must follow a --call")
            arguments = json.loads(value)
            if not isinstance(arguments, dict):
                raise ValueError(f"--args must be a JSON object, not {value}")
            calls[-1][1] = arguments
        elif flag == "--client-name":
            client_name = value
        else:
            raise ValueError(f"unknown option {flag}")
        i += 2
    return url, calls, client_name


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def describe(error: BaseException) -> str:
    # The transport's task group wraps what failed in exception groups: name the innermost causes.
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"


async def run(url, calls, client_name, out):
    http = HttpLog()
    out["http"] = http.exchanges
    headless = Headless(http)
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name=client_name,
            redirect_uris=[REDIRECT_URI],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=MemoryStorage(),
        redirect_handler=headless.redirect,
        callback_handler=headless.callback,
    )
    async with httpx2.AsyncClient(
        auth=provider,
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"response": [http.hook]},
    ) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                cursor = None
                while True:
                    page = await session.list_tools(params={"cursor": cursor} if cursor else None)
                    out["tools"].extend(t.name for t in page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                for name, arguments in calls:
                    try:
                        result = await session.call_tool(name, arguments)
                        out["calls"].append({"name": name, "result": dump(result)})
                    except Exception as e:  # the SDK raises MCPError for JSON-RPC errors
                        err = getattr(e, "error", None)
                        out["calls"].append({
                            "name": name,
                            "error": {
                                "code": getattr(err, "code", None),
                                "message": getattr(err, "message", str(e)),
                            },
                        })


def main():
    try:
        url, calls, client_name = parse_args(sys.argv[1:])
    except ValueError as e:
        print(f"mcp_oauth_client.py: {e}\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    out = {"ok": False, "url": url, "tools": [], "calls": [], "http": []}
    try:
        asyncio.run(run(url, calls, client_name, out))
        out["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the report says what failed, whatever it was
        if isinstance(e, KeyboardInterrupt):
            raise
        out["error"] = describe(e)
    print(json.dumps(out, sort_keys=True))
    if not out["ok"]:
        print(f"mcp_oauth_client.py: {url}: {out['error']}", file=sys.stderr)
        sys.exit(1)


main()
