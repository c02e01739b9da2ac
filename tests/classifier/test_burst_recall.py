"""Real-world shapes users reported missed: national phone formats without a
country code, E.164 numbers grouped unusually, IPv6 in its other forms,
IBANs in lower case; and ordinary numbers in prose that must stay clean."""

from __future__ import annotations

import pytest
from kinference_common.detectors.core import Classifiers


@pytest.fixture(scope="module", params=["auto", "re"])
def classifiers(request: pytest.FixtureRequest) -> Classifiers:
    c = Classifiers(engine=request.param)
    c.warm_up()
    return c


@pytest.mark.parametrize("text", [
    "Ring me on 07700 900 123 tomorrow.",
    "Mon numéro: 0612 34 56 78",
    "Meine Nummer ist 030 123 45 67.",
    "ligue (21) 555-019 hoje",
    "ligue (21) 5555-0199 hoje",
    "Call +447700 900 123 please",
    "Appelez le +33 (0)6 12 34 56 78.",
    "reach me: +49 (0)30 123 45 67",
    "The office is 0161 496 0000.",
    "bel 06-1234 5678 even",
])
def test_phone_shapes_are_at_least_unknown(classifiers: Classifiers, text: str) -> None:
    assert classifiers.classify("pii", [text]).tags[0] in ("pii-confirmed", "pii-unknown"), text


@pytest.mark.parametrize("text", [
    "client 2a00:1450:4001:82b::200e connected",
    "from 2A00:1450:4001:082B:0000:0000:0000:200E",
    "[2a00:1450:4001:82b::200e]:443",
    "the 2a00:1450:4001:: block",
    "my iban is de89 3704 0044 0532 0130 00",
    "iban gb29nwbk60161331926819",
])
def test_ipv6_forms_and_lower_case_ibans_are_confirmed(classifiers: Classifiers, text: str) -> None:
    assert classifiers.classify("pii", [text]).tags[0] == "pii-confirmed", text


@pytest.mark.parametrize("text", [
    "It costs €1 411,08 incl. VAT, delivered on 03.12.2024 at 14:30.",
    "Upgrade to version 15.35.160 before 2025-01-31.",
    "Order 24 x 111 units; final score 3-4; room 1067.",
    "Open 07:00 to 21:00, meet on 3/12/2025 at 2:30 pm.",
    "The box is 112 x 107 x 195 cm; we sold 1,250,000 copies between 1999 and 2023.",
    "ref 069.130.680-08 failed its check",
    "the 2001:db8:: documentation prefix",
])
def test_ordinary_numbers_stay_clean(classifiers: Classifiers, text: str) -> None:
    assert classifiers.classify("pii", [text]).tags == ["pii-none"], text
