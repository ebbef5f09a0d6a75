;;; magent-store-core-edges-tests.el --- ERT: edges of the shim's public functions  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend per test.  What is pinned here: a flush request has
;; a flush sent, a load returns what Emacs still held unsent, closing every session says how many it
;; closed, and flushing the unsent sessions flushes those and only
;; those.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)

;;;; Flush requests

(ert-deftest magent-store-a-flush-request-sends-a-flush-within-the-interval ()
  "A request on a session with no flush due has one sent, by its timer;
a second request while it is due neither postpones it nor adds one."
  (magent-store-test--with-backend
    (let* ((session (magent-store-test--session "s-asked"))
           (flushes (magent-store--session-flushes session))
           (deadline (+ (float-time) 10)))
      (should-not (magent-store--session-deadline session))
      (magent-store-request-flush "s-asked")
      (let ((due (magent-store--session-deadline session)))
        (should due)
        (should (magent-store--session-timer session))
        (magent-store-request-flush "s-asked")
        (should (eql (magent-store--session-deadline session) due)))
      ;; Timers run while this waits.
      (while (and (= (magent-store--session-flushes session) flushes)
                  (< (float-time) deadline))
        (accept-process-output nil 0.05))
      (should (= (magent-store--session-flushes session) (1+ flushes)))
      (should-not (magent-store--session-deadline session)))))

;;;; Load

(ert-deftest magent-store-a-load-returns-what-emacs-still-held-unsent ()
  "Loading a session whose entries are still queued in Emacs returns them."
  (magent-store-test--with-backend
    (let ((session (magent-store-test--session "s-load")))
      (magent-store-append-item-content "s-load" "item-1" "saved ")
      (magent-store-flush "s-load")
      (magent-store-append-item-content "s-load" "item-1" "still in Emacs")
      (should (= (magent-store--unsaved session) 1))
      (let ((loaded (magent-store-load "s-load")))
        (should (= (magent-store--unsaved session) 0))
        (should (equal (magent-store-test--content loaded)
                       "saved still in Emacs"))))))

;;;; Closing every session

(ert-deftest magent-store-closing-every-session-returns-how-many-were-closed ()
  "`magent-store-close-all' saves, closes and forgets each session; it
returns how many it closed."
  (magent-store-test--with-backend
    (dolist (id '("s-one" "s-two" "s-three"))
      (magent-store-test--session id)
      (magent-store-append-item-content id "item-1" (concat "unsent of " id)))
    (should (= (magent-store-close-all) 3))
    (should (= (hash-table-count magent-store--sessions) 0))
    (should (= (magent-store-close-all) 0))
    (dolist (id '("s-one" "s-two" "s-three"))
      (should (equal (magent-store-test--content (magent-store-load id))
                     (concat "unsent of " id))))))

;;;; Flushing what is unsent

(ert-deftest magent-store-flushing-the-unsent-leaves-saved-sessions-alone ()
  "With no session named, only the sessions with something unsaved are flushed."
  (magent-store-test--with-backend
    (let* ((dirty (magent-store-test--session "s-dirty"))
           (clean (magent-store-test--session "s-clean"))
           (dirty-flushes (magent-store--session-flushes dirty))
           (clean-flushes (magent-store--session-flushes clean)))
      (magent-store-append-item-content "s-dirty" "item-1" "unsent")
      (should-not (magent-store--session-deadline clean))
      (should-not (magent-store--session-inflight clean))
      (should (= (magent-store--session-fill clean) 0))
      (magent-store-flush-unsent)
      (should (= (magent-store--unsaved dirty) 0))
      (should (= (magent-store--session-flushes dirty) (1+ dirty-flushes)))
      (should (= (magent-store--session-flushes clean) clean-flushes))
      (should (equal (magent-store-test--content (magent-store-load "s-dirty"))
                     "unsent")))))

(ert-deftest magent-store-flushing-the-unsent-of-one-session-flushes-it-only ()
  "With a session named, only that session is flushed, though others are unsent."
  (magent-store-test--with-backend
    (let* ((named (magent-store-test--session "s-named"))
           (other (magent-store-test--session "s-other"))
           (other-flushes (magent-store--session-flushes other)))
      (magent-store-append-item-content "s-named" "item-1" "named")
      (magent-store-append-item-content "s-other" "item-1" "other")
      (magent-store-flush-unsent "s-named")
      (should (= (magent-store--unsaved named) 0))
      (should (= (magent-store--unsaved other) 1))
      (should (= (magent-store--session-flushes other) other-flushes))
      (should (magent-store--session-deadline other)))))

(provide 'magent-store-core-edges-tests)
;;; magent-store-core-edges-tests.el ends here
