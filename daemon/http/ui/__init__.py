"""sinkd's own page (`/ui` on the HTTP front): what only sinkd knows, seen and controlled in a
browser. A tenant's sessions with their cache maps, what recall brought back and from where, its
memory (search and forget), its narrated streams; the admin's tenants, prefixes and node.

Served as HTML from the daemon, no script at all and one stylesheet of its own: nothing is
fetched from elsewhere, nothing is built on the user's side, and the Content-Security-Policy can
forbid every script. Logins are cookies (logins.py), pages are escaped by construction
(markup.py), drawings are pure functions of receipts and facts (drawings.py), and the routes
(routes.py and the *_pages.py beside it) only translate between forms and the service's named parts.
"""
