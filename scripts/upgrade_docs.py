"""The config words of lfed 0.3 in prose and snippets -> 0.4's (issue 41): ``aggregation`` -> ``combination``,
``compression`` -> ``channel`` where they name the setting (backticked, or a YAML key). Used once on docs/."""

import re
import sys

RULES = [
    (r"`aggregation(?=[:`= ])", "`combination"),
    (r"`compression(?=[:`= ])", "`channel"),
    (r"^(\s+)aggregation:", r"\1combination:"),
    (r"^(\s+)compression:", r"\1channel:"),
    (r"aggregation=mean, compression=None", "combination=mean, channel=None"),
    (r"`compression=", "`channel="),
]

for path in sys.argv[1:]:
    text = open(path).read()
    new = text
    for pattern, repl in RULES:
        new = re.sub(pattern, repl, new, flags=re.M)
    if new != text:
        open(path, "w").write(new)
        print(path)
