"""``imgpipe stage SRC DST``: a packed folder copied whole between two locations, every file checked.

``stager`` runs it (checks, resume, the commit), ``plan`` lists the files a manifest names,
``target`` is what a copy is written to (a local folder or a URL) with its journal, ``copier``
moves the bytes (several files and ranges at once, each file hashed as it lands) and ``waiting``
lets several processes share one DST (the lock, waiting for the manifest, a failure's record).
"""
