"""One engine, many faces: how `localspec generate` and `localspec chat` find a running
`localspec serve` and use it instead of loading the models a second time.

* `state`: the small file `serve` leaves in the data directory while it runs (`serve.json`).
* `probe`: finding a server (that file, else the configured port), checking it answers as
  localspec, serves the model asked for, and takes our key; else why the face loads in-process.
* `remote`: a reply streamed from an OpenAI-compatible server as the engine's own events, token
  origins and stats included when the server is localspec.

Nothing here imports the engine or the server: a face that attaches loads no model code.
"""
