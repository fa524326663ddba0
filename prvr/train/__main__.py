"""``python -m prvr.train``: the command line of ``prvr.train.loop``."""

import logging

from prvr.train.loop import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
