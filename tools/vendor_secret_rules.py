"""Write backend/magent_store/redaction/secret-rules.toml from a checkout of gitleaks.

    python3 tools/vendor_secret_rules.py GITLEAKS_CHECKOUT

Copies, verbatim, the global allowlist's regexes and stopwords and the rules
named in RULES from the checkout's config/gitleaks.toml, under gitleaks'
MIT notice and the commit they came from, then appends magent-store's own
section (kept in MAGENT_STORE_SECTION below).  docs/REDACTION.md says when
and how to run it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "backend" / "magent_store" / "redaction" / "secret-rules.toml"

# The credentials redaction looks for (docs/REDACTION.md says why these).
RULES = (
    "aws-access-token",
    "github-app-token", "github-fine-grained-pat", "github-oauth", "github-pat", "github-refresh-token",
    "gitlab-cicd-job-token", "gitlab-deploy-token", "gitlab-feature-flag-client-token", "gitlab-feed-token",
    "gitlab-incoming-mail-token", "gitlab-kubernetes-agent-token", "gitlab-oauth-app-secret", "gitlab-pat",
    "gitlab-pat-routable", "gitlab-ptt", "gitlab-rrt", "gitlab-runner-authentication-token",
    "gitlab-runner-authentication-token-routable", "gitlab-scim-token", "gitlab-session-cookie",
    "slack-app-token", "slack-bot-token", "slack-config-access-token", "slack-config-refresh-token",
    "slack-legacy-bot-token", "slack-legacy-token", "slack-legacy-workspace-token", "slack-user-token",
    "slack-webhook-url",
    "private-key", "jwt", "curl-auth-header",
    "openai-api-key", "anthropic-api-key", "anthropic-admin-api-key", "gcp-api-key",
    "huggingface-access-token", "huggingface-organization-api-token", "perplexity-api-key",
)

MAGENT_STORE_SECTION = '''
# ---------------------------------------------------------------------------
# magent-store's own additions (not from gitleaks; the vendoring script keeps
# them as they are).
[magent-store]

# gitleaks' only Authorization-header rule (curl-auth-header) needs a curl
# command around the header.  This one takes the header wherever it is
# printed (HTTP traces, logs, `curl -v` output): the header name, a colon,
# one of the schemes that carry a credential, and a value of at least 12
# token characters with some variety (entropy), so "Authorization: Bearer
# <token>" in prose and documentation is left alone.
[[magent-store.rules]]
id = "authorization-header"
description = "An HTTP Authorization header carrying a credential."
regex = \'\'\'(?i)\\b(?:proxy-)?authorization:[ \\t]{0,5}(?:basic[ \\t]{1,5}([a-z0-9+/]{12,}={0,3})|(?:bearer|token|api-key)[ \\t]{1,5}([\\w=~@.+/-]{12,}))\'\'\'
entropy = 3
keywords = ["authorization:"]

# How the stream redactor holds back text (docs/REDACTION.md):
# - anchors: the lowercase text every match of the rule starts with, where
#   that is not one of its keywords;
# - window: for a rule whose matches span whitespace, how many characters
#   after an anchor the text is held back at most while no match is complete.
[magent-store.stream]
openai-api-key = { anchors = ["sk-"] }
slack-webhook-url = { anchors = ["hooks.slack.com", "http"] }
private-key = { window = 16384 }
curl-auth-header = { window = 1024 }
authorization-header = { anchors = ["proxy-authorization:", "authorization:"], window = 64 }
'''


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    checkout = Path(sys.argv[1])
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    source = subprocess.run(["git", "-C", str(checkout), "show", "HEAD:config/gitleaks.toml"],
                            capture_output=True, text=True, check=True).stdout
    license_text = subprocess.run(["git", "-C", str(checkout), "show", "HEAD:LICENSE"],
                                  capture_output=True, text=True, check=True).stdout
    blocks = re.split(r"\n(?=\[\[rules\]\]\n)", source)
    by_id: dict[str, str] = {}
    for block in blocks[1:]:
        rule_id = tomllib.loads(block.replace("[[rules]]", "", 1))["id"]
        by_id[rule_id] = block.rstrip("\n")
    missing = [r for r in RULES if r not in by_id]
    if missing:
        print(f"not in this gitleaks: {', '.join(missing)}", file=sys.stderr)
        return 1
    head = blocks[0]
    allow = re.search(r"^\[allowlist\]\n.*?(?=^\[\[rules\]\]|\Z)", head, re.S | re.M)
    assert allow is not None
    allowlist = re.sub(r"^paths = \[\n.*?^\]\n", "", allow.group(0), flags=re.S | re.M).rstrip("\n")
    notice = "\n".join(f"# {line}".rstrip() for line in license_text.strip().splitlines())
    text = (
        "# Secret patterns for magent-store's redaction, vendored from gitleaks\n"
        "# (https://github.com/gitleaks/gitleaks, config/gitleaks.toml) at commit\n"
        f"# {commit}\n"
        "# by tools/vendor_secret_rules.py: gitleaks' global allowlist (its regexes\n"
        "# and stopwords) and the rules redaction uses, copied as they are, then\n"
        "# magent-store's own section at the end.  Do not edit the gitleaks part by\n"
        "# hand: run the script on a newer checkout (docs/REDACTION.md).\n"
        "#\n"
        "# gitleaks' rules are under this licence:\n#\n"
        f"{notice}\n\n"
        f'source-commit = "{commit}"\n\n'
        f"{allowlist}\n\n"
        + "\n\n".join(by_id[r] for r in RULES)
        + "\n"
        + MAGENT_STORE_SECTION
    )
    tomllib.loads(text)
    OUT.write_text(text)
    print(f"{OUT}: {len(RULES)} rules from gitleaks {commit[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
