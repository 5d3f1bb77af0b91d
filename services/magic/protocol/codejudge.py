"""The contract between the reward service and the code judge (`magic.codejudge`), over HTTP:

    POST /v1/judge   {"program": "...", "ground_truth": "<the problem's tests as JSON>"}
    200              {"status": "correct|wrong|no_answer|timeout|error", "answer": "...", "details": "...", "seconds": 0.2}

with ``Authorization: Bearer <token>``. Any other reply means the judge did not judge the
program: 401/403 (the token), 503 (not ready, or shutting down before the program ran to its
end), 400/413/422 (the request itself).
"""

JUDGE_PATH = "/v1/judge"
MAX_CODE_CHARS = 256 * 1024
"""Programs longer than this are judged wrong without being run (the reward service sends at most
one character more)."""
RETRY_STATUSES = (401, 403, 429, 502, 503, 504)
"""Replies after which the program was not judged and the judge may take it later: the client
waits (a wrong token is a misconfiguration an operator fixes, not the response's fault)."""
