"""One Session's life in the operator: its loop (`loop`) runs one pass after another, each in
steps that own one concern: observe (`observe`), create the sandbox (`sandbox`, adopting a
warm pod through `adoption`), release it once archived (`release`, `archiving`) and drive
turns (`drive`). The Session is read and written through its view (`view`), turns are kept
in its status (`store`), and the harness is reached through the wire (`wire`, `wiretoken`)."""
