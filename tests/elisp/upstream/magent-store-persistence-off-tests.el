;;; magent-store-persistence-off-tests.el --- With persistence off, magent's calls reach no store  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-persistence-enabled' nil is the benchmarks' baseline: the
;; mode's advice is in place but drops what magent gives it.  Nothing may
;; be opened, queued or sent then.  Upstream magent's code, a real backend.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-magent-tests)

(ert-deftest magent-store-magent-persistence-off-opens-and-queues-nothing ()
  "A turn streamed and saved through magent with persistence off stores nothing."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (pcase-let* ((magent-store-persistence-enabled nil)
                 (session (magent-store-magent-test--session "s-off" 'global))
                 (`(,thread ,turn-id ,item)
                  (magent-store-magent-test--reply session)))
      (magent-thread-append-item-content thread item "a chunk")
      (magent-thread-complete-item thread item)
      (magent-thread-complete-turn thread turn-id nil)
      (should-not (gethash "s-off" magent-store--sessions))
      (should (= (hash-table-count magent-store--sessions) 0))
      (should-not magent-store-magent--adapter-failures))))

(provide 'magent-store-persistence-off-tests)
;;; magent-store-persistence-off-tests.el ends here
