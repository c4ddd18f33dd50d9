from __future__ import annotations

import pytest

from tests.helpers.checkpoints import DEMO_TARGET

EOS = 1


@pytest.fixture(scope="session")
def xgr_backend():
    from grammar import XGrammarBackend

    return XGrammarBackend.from_folder(DEMO_TARGET, vocab_size=4096, stop_token_ids=[EOS])
