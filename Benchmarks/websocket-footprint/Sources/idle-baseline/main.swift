// The floor: a Swift program that prints its pid and "ready", then waits.
import Glibc

let line = "ready pid=\(getpid())\n"
_ = write(1, line, line.utf8.count)
while true { pause() }
