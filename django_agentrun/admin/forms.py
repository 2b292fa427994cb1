"""The forms a person fills in to decide on tool calls, one by one or in bulk."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _


def parse_result(raw: str) -> Any:
    """A person's result: JSON when it parses, the text itself otherwise."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class _JSONObjectField(forms.CharField):
    widget = forms.Textarea(attrs={"rows": 8, "cols": 80, "class": "vLargeTextField"})

    def to_python(self, value: Any) -> Any:
        raw = super().to_python(value).strip()
        if not raw:
            return None
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(
                _("Not valid JSON: %(error)s"), params={"error": exc}, code="json"
            ) from exc
        if not isinstance(parsed, dict):
            raise ValidationError(_("The arguments must be a JSON object."), code="json_object")
        return parsed


class ApproveForm(forms.Form):
    token = forms.CharField(widget=forms.HiddenInput)
    note = forms.CharField(
        label=_("Note"), required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 80})
    )
    arguments = _JSONObjectField(
        label=_("Arguments"),
        required=False,
        help_text=_(
            "Edit to approve different arguments (a JSON object); "
            "the tool's input schema checks them again."
        ),
    )


REASON_HELP = _(
    "Sent to the model as the tool's result: “A person declined this tool call: (your reason).”"
)


class RejectForm(forms.Form):
    token = forms.CharField(widget=forms.HiddenInput)
    reason = forms.CharField(
        label=_("Reason"),
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text=REASON_HELP,
    )


class ResolveForm(forms.Form):
    token = forms.CharField(widget=forms.HiddenInput)
    ACTIONS = [
        ("done", _("Mark done: it happened, record this result")),
        ("retry", _("Retry: it did not happen, run it once more")),
        ("fail", _("Fail: close it with an error result")),
    ]
    action = forms.ChoiceField(label=_("Decision"), choices=ACTIONS, widget=forms.RadioSelect)
    result = forms.CharField(
        label=_("Result"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text=_("The tool's result for “done”: JSON, or plain text."),
    )
    note = forms.CharField(
        label=_("Note"), required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 80})
    )

    def clean(self):
        data = super().clean()
        if data.get("action") == "done" and not data.get("result", "").strip():
            self.add_error("result", _("“Mark done” needs the tool's result."))
        return data


class BulkApproveForm(forms.Form):
    note = forms.CharField(label=_("Note"), required=False)


class BulkRejectForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"), widget=forms.Textarea(attrs={"rows": 2}), help_text=REASON_HELP
    )


class BulkDoneForm(forms.Form):
    result = forms.CharField(
        label=_("Result"),
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text=_("Recorded as the result of every selected call: JSON, or plain text."),
    )
    note = forms.CharField(label=_("Note"), required=False)


class BulkNoteForm(forms.Form):
    note = forms.CharField(
        label=_("Note"),
        required=False,
        help_text=_("Kept with the decision; a failed call's note is also told to the model."),
    )
