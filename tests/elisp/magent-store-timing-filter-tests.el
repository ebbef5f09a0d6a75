;;; magent-store-timing-filter-tests.el --- What a timing record is kept for  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-record-timing' keeps a record only when timing is on and
;; the type is one of `magent-store-timing-types' (an Elisp mutation
;; survivor: the two conditions joined by `or' passed every test).

;;; Code:

(require 'ert)
(require 'magent-store-timing)

(ert-deftest magent-store-timing-records-known-types-only-and-only-when-on ()
  "A record needs timing on and a known type; nothing else is queued."
  (let ((magent-store-timing--queue nil)
        ;; A pending send: no timer is started by the records below.
        (magent-store-timing--timer 'pending)
        (magent-store-timing-enabled t))
    (should-not (magent-store-record-timing 'no-such-type :count 1))
    (should-not magent-store-timing--queue)
    (let ((magent-store-timing-enabled nil))
      (should-not (magent-store-record-timing 'acp-update :count 1))
      (should-not (magent-store-record-timing 'no-such-type :count 1)))
    (should-not magent-store-timing--queue)
    (should (magent-store-record-timing 'acp-update :count 1))
    (should (= (length magent-store-timing--queue) 1))))

(provide 'magent-store-timing-filter-tests)
;;; magent-store-timing-filter-tests.el ends here
