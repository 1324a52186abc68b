"""Byzantine clients as a component of the run (``attack:``; docs/robustness.md §1); one attack per file."""

from lfed.robust.attacks.alie import ALIE, alie_z
from lfed.robust.attacks.backdoor import Backdoor, stamp
from lfed.robust.attacks.base import Attack, NoAttack, byzantine_set
from lfed.robust.attacks.ipm import IPM
from lfed.robust.attacks.label_flip import LabelFlip
from lfed.robust.attacks.mimic import Mimic
from lfed.robust.attacks.minmax import MinMax, MinSum
from lfed.robust.attacks.simple import Gaussian, Scaling, SignFlip

__all__ = ["ALIE", "IPM", "Attack", "Backdoor", "Gaussian", "LabelFlip", "Mimic", "MinMax", "MinSum", "NoAttack", "Scaling",
           "SignFlip", "alie_z", "byzantine_set", "stamp"]
