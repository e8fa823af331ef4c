"""Fetching, on the agents: one page's body and text, guarded, bounded and polite.

``fetcher`` (over ``transport``, our pinned HTTP/1.1 pool; ``decoding`` with a bound,
``politeness`` per host and robots.txt, ``fetch_settings``), ``guard`` (the SSRF
check every fetch goes through) and ``reach`` (who may reach the fetch allowlist),
``browser`` (rendering in Chromium), ``text`` (visible text and its fingerprint),
``filters`` (a tracking's view of a page) and ``pagekind`` (error and script-built
pages). Nothing here reads the page checker's tables but ``reach``'s allowlist.
"""
