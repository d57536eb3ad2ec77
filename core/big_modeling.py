"""`acc.big_modeling`: Accelerate's module name (`accelerate.big_modeling`) for `acc.big_model`; importing it
gives that very module, so `from acc.big_modeling import dispatch_model` is `acc.big_model.dispatch_model`."""

import sys

from acc import big_model

sys.modules[__name__] = big_model
