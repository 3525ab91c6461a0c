"""Admission of AppWrappers: what a user may ask the controller to create on their behalf (no more than they
may create themselves).

The controller serves two webhooks for AppWrappers of both API groups, on create and update:
- mutate (``/mutate``): records the creator, binds the quota label to the namespace;
- validate (``/validate``): refuses bad shape, items the requesting user could not create themselves, denylisted
  kinds, changed items after creation, forged quota and priority, fault tolerance annotations set to values the
  controller would not act on (``mcad.api.faulttolerance``, under the cluster's ceilings), topology annotations
  that are not node label keys (``topology``, which also warns of a required level no node carries yet).

Modules: ``request`` (the AdmissionReview in and out, the types every check shares), ``facts`` (what checks may ask
the cluster, as a Protocol), ``kubefacts`` (those answers from the API server, bounded in time and cached briefly),
``topology`` (the topology annotations' refusals and warnings), ``review`` (the checks composed into the two
reviewers).
"""
