"""After the search: export the winner for serving, predict with it, keep a champion, warm-start the
next search from earlier runs."""
