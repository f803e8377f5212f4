#!/usr/bin/env python3
"""scripts/soak_serve.py — the server soak of issue 11: N concurrent streaming clients for S
seconds against `kl serve`, every reply checked against the same request served alone first
(greedy sampling: the text must be identical, so no token was lost, duplicated or mixed up
between streams), the server's resident memory sampled all along.  Prints one JSON object;
exit 0 when every reply matched and no request failed, 1 otherwise.

    kl serve MODEL --port 0 --json > server.json &
    python3 scripts/soak_serve.py --url http://127.0.0.1:PORT --model MODEL --pid $! \\
        --clients 32 --seconds 60

Python's standard library only.
"""
import argparse
import json
import threading
import time
import urllib.error
import urllib.request

PROMPTS = ["Tell me about the sea.", "List three colours.", "What is a prime number?",
           "Write a haiku about rain.", "Explain recursion briefly.", "Say hello in French.",
           "Describe a cat.", "Count from one to five."]


def chat(url, model, prompt, max_tokens, stream):
    body = json.dumps({"model": model, "stream": stream, "max_tokens": max_tokens,
                       "temperature": 0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.load(r)["choices"][0]["message"]["content"] or ""
        text = []
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    text.append(ch.get("delta", {}).get("content") or "")
        return "".join(text)


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--pid", type=int, default=0, help="the server's pid (memory samples)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--max-tokens", type=int, default=48)
    a = p.parse_args()

    alone = {q: chat(a.url, a.model, q, a.max_tokens, False) for q in PROMPTS}
    lock = threading.Lock()
    stats = {"requests": 0, "mismatches": 0, "errors": 0, "examples": []}
    stop_at = time.monotonic() + a.seconds

    def client(i):
        k = i
        while time.monotonic() < stop_at:
            q = PROMPTS[k % len(PROMPTS)]
            k += 1
            try:
                got = chat(a.url, a.model, q, a.max_tokens, True)
                ok, err = got == alone[q], None
            except (urllib.error.URLError, OSError, ValueError) as e:
                ok, err = False, str(e)
            with lock:
                stats["requests"] += 1
                if err:
                    stats["errors"] += 1
                elif not ok:
                    stats["mismatches"] += 1
                if not ok and len(stats["examples"]) < 3:
                    stats["examples"].append({"prompt": q, "error": err})

    rss = [rss_kib(a.pid)] if a.pid else []
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if a.pid:
            rss.append(rss_kib(a.pid))
    for t in threads:
        t.join()
    # memory flat: the second half's peak against the first half's
    half = len(rss) // 2
    first, second = max(rss[:half] or [0]), max(rss[half:] or [0])
    out = {"clients": a.clients, "seconds": a.seconds, "requests": stats["requests"],
           "errors": stats["errors"], "mismatches": stats["mismatches"],
           "examples": stats["examples"], "rss_kib_first_half_peak": first,
           "rss_kib_second_half_peak": second, "rss_kib_samples": len(rss)}
    out["ok"] = stats["errors"] == 0 and stats["mismatches"] == 0 and stats["requests"] > 0
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
