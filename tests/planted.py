"""Fake credentials of every kind redaction knows, built at run time.

Nothing here is or was a live secret, and the repository holds none of them
as text: each is put together from pieces and random characters (seeded),
so a secret scanner reading the repository finds nothing to flag.
"""

from __future__ import annotations

import base64
import random
import re
import string
from dataclasses import dataclass

ALNUM = string.ascii_letters + string.digits
UPPER_B32 = string.ascii_uppercase + "234567"
LOWER_ALNUM = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class Plant:
    """A line holding one secret: KIND, the TEXT, and the SECRET in it that must go."""

    kind: str
    text: str
    secret: str


def _pick(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(obj: str) -> str:
    return base64.urlsafe_b64encode(obj.encode()).decode().rstrip("=")


def secrets(seed: int = 27) -> dict[str, str]:
    """KIND -> a fake secret of that kind (what the rule calls the secret)."""
    r = random.Random(seed)
    a, w = ALNUM, ALNUM + "_-"
    gl = "gl"  # every GitLab prefix, split so no prefix stands whole in the file
    begin, end, pk = "-----" + "BEGIN", "-----" + "END", "PRIVATE" + " KEY-----"
    body = "\n".join(_pick(r, ALNUM + "+/", 64) for _ in range(6))
    return {
        "aws-access-token": "AK" + "IA" + _pick(r, UPPER_B32, 16),
        "github-pat": "gh" + "p_" + _pick(r, a, 36),
        "github-oauth": "gh" + "o_" + _pick(r, a, 36),
        "github-app-token": "gh" + "s_" + _pick(r, a, 36),
        "github-refresh-token": "gh" + "r_" + _pick(r, a, 36),
        "github-fine-grained-pat": "github" + "_pat_" + _pick(r, ALNUM + "_", 82),
        "gitlab-pat": gl + "pat-" + _pick(r, a, 20),
        "gitlab-pat-routable": gl + "pat-" + _pick(r, a, 40) + "." + _pick(r, LOWER_ALNUM, 9),
        "gitlab-cicd-job-token": gl + "cbt-" + _pick(r, a, 3) + "_" + _pick(r, a, 20),
        "gitlab-deploy-token": gl + "dt-" + _pick(r, a, 20),
        "gitlab-feature-flag-client-token": gl + "ffct-" + _pick(r, a, 20),
        "gitlab-feed-token": gl + "ft-" + _pick(r, a, 20),
        "gitlab-incoming-mail-token": gl + "imt-" + _pick(r, a, 25),
        "gitlab-kubernetes-agent-token": gl + "agent-" + _pick(r, a, 50),
        "gitlab-oauth-app-secret": gl + "oas-" + _pick(r, a, 64),
        "gitlab-ptt": gl + "ptt-" + _pick(r, "0123456789abcdef", 40),
        "gitlab-rrt": "GR13" + "48941" + _pick(r, a, 20),
        "gitlab-runner-authentication-token": gl + "rt-" + _pick(r, a, 20),
        "gitlab-runner-authentication-token-routable": gl + "rt-t1_" + _pick(r, a, 30) + "." + _pick(r, LOWER_ALNUM, 9),
        "gitlab-scim-token": gl + "soat-" + _pick(r, a, 20),
        "gitlab-session-cookie": "_gitlab" + "_session=" + _pick(r, LOWER_ALNUM, 32),
        "slack-app-token": "xa" + "pp-1-A" + _pick(r, string.ascii_uppercase + string.digits, 10) + "-"
        + _pick(r, string.digits, 13) + "-" + _pick(r, "0123456789abcdef", 64),
        "slack-bot-token": "xo" + "xb-" + _pick(r, string.digits, 12) + "-" + _pick(r, string.digits, 13) + "-"
        + _pick(r, a, 24),
        "slack-legacy-bot-token": "xo" + "xb-" + _pick(r, string.digits, 9) + "-" + _pick(r, a, 22),
        "slack-user-token": "xo" + "xp-" + "-".join(_pick(r, string.digits, 12) for _ in range(3)) + "-"
        + _pick(r, a, 32),
        "slack-legacy-token": "xo" + "xs-" + "-".join(_pick(r, string.digits, 10) for _ in range(3)) + "-"
        + _pick(r, "0123456789abcdef", 64),
        "slack-legacy-workspace-token": "xo" + "xa-2-" + _pick(r, a, 40),
        "slack-config-access-token": "xoxe" + ".xoxp-1-" + _pick(r, string.ascii_uppercase + string.digits, 164),
        "slack-config-refresh-token": "xoxe" + "-1-" + _pick(r, string.ascii_uppercase + string.digits, 146),
        "slack-webhook-url": "https://hooks" + ".slack.com/services/" + _pick(r, ALNUM + "+/", 46),
        "private-key": f"{begin} RSA {pk}\n{body}\n{end} RSA {pk}",
        "jwt": _b64url('{"alg":"HS256","typ":"JWT"}') + "." + _b64url('{"sub":"1234567890","name":"Dev Ops","iat":1516239022}')
        + "." + _pick(r, w, 43),
        "openai-api-key": "sk-" + "proj-" + _pick(r, w, 74) + "T3Blbk" + "FJ" + _pick(r, w, 74),
        "anthropic-api-key": "sk-" + "ant-api03-" + _pick(r, w, 93) + "AA",
        "anthropic-admin-api-key": "sk-" + "ant-admin01-" + _pick(r, w, 93) + "AA",
        "gcp-api-key": "AI" + "za" + _pick(r, w, 35),
        "huggingface-access-token": "hf" + "_" + _pick(r, string.ascii_letters, 34),
        "huggingface-organization-api-token": "api" + "_org_" + _pick(r, string.ascii_letters, 34),
        "perplexity-api-key": "pp" + "lx-" + _pick(r, a, 48),
        "curl-auth-header": _pick(r, a, 32),
        "authorization-header": _pick(r, w, 40),
    }


def plants(seed: int = 27) -> list[Plant]:
    """One line per kind: the secret with ordinary and non-ASCII text around it."""
    out = []
    for kind, secret in secrets(seed).items():
        if kind == "curl-auth-header":
            text = f"$ curl -s https://api.example.test/v1 -H \"X-Api-Key: {secret}\"\n→ 200 OK ✓"
        elif kind == "authorization-header":
            text = f"> GET /v1/models HTTP/1.1\n> Auth" f"orization: Bearer {secret}\n> Accept: */*\n完成"
        else:
            text = f"密钥是 {secret} — ключ 🔑 done\n"
        out.append(Plant(kind, text, secret))
    out.append(Plant("auth-source", "mot de passe: «Sésame-ouvre-toi-42» ok", "Sésame-ouvre-toi-42"))
    out.append(Plant("ticket", "voir TICKET-048213 ensuite", "TICKET-048213"))
    return out


LITERALS = ["Sésame-ouvre-toi-42"]
PATTERNS = {"ticket": r"TICKET-\d{6}"}


# What files hold by chance, whatever they hold: lowercase hex digits (ids, hashes, the
# sha1 of a project's root, a database's pages), digits, and the punctuation of dates and
# times (2026-12-02T09:58:43.5+00:00).  Four of these in a row are no trace of a secret:
# ``e4b8`` of a Slack token turns up in some hash.  Sixteen in a row do not turn up by chance.
CHANCE = re.compile(r"[0-9a-f.:+TZ-]+")
CHANCE_RUN = 16


def traces(secret: str, run: int = 4) -> list[str]:
    """The pieces of SECRET whose presence in a file is a trace of it, in order.

    Every RUN consecutive characters of it that hold one character files do
    not hold by chance (see `CHANCE`), and every `CHANCE_RUN` consecutive
    characters made only of those: a secret of hex digits (``glptt-`` and
    forty of them) still leaves a trace.
    """
    pieces = [secret[i : i + run] for i in range(len(secret) - run + 1)]
    pieces = [p for p in pieces if not CHANCE.fullmatch(p)]
    longer = [secret[i : i + CHANCE_RUN] for i in range(len(secret) - CHANCE_RUN + 1)]
    pieces += [p for p in longer if CHANCE.fullmatch(p)]
    return list(dict.fromkeys(pieces))
