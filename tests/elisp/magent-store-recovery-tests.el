;;; magent-store-recovery-tests.el --- ERT: the shim when its backend dies  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend, really killed.  The long runs (SIGKILLs at random
;; moments, full disks, two writers) are tests/faults/faults.py; these
;; pin what the user is told and that nothing is dropped meanwhile.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-tests)

(defun magent-store-recovery-test--kill-and-wait (predicate)
  "SIGKILL the backend, then run timers until PREDICATE holds (5 s at most)."
  (signal-process (magent-store--backend-pid magent-store--backend) 'SIGKILL)
  (let ((deadline (+ (float-time) 5)))
    (while (and (not (funcall predicate)) (< (float-time) deadline))
      (sleep-for 0.05))))

(ert-deftest magent-store-giving-up-names-the-key-and-keeps-the-changes ()
  "Past the restart limit the shim stops, says how to retry, and drops nothing."
  (magent-store-test--with-backend
    (let ((magent-store-restart-limit 0)
          (magent-store--recovering nil)
          (messages nil))
      (magent-store-open "s-up")
      (magent-store-test--start-turn "s-up")
      (magent-store-flush "s-up")
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (magent-store-recovery-test--kill-and-wait
         (lambda () magent-store--gave-up))
        (magent-store-append-item-content "s-up" "item-1" "kept in Emacs"))
      (should magent-store--gave-up)
      (should (cl-some (lambda (m) (string-match-p "magent-store-restart retries" m))
                       messages))
      (should-not (cl-some (lambda (m) (string-match-p "\\\\\\[" m)) messages))
      (should-not (cl-some (lambda (m) (string-match-p "nothing was lost" m)) messages))
      (should (= (magent-store--unsaved (gethash "s-up" magent-store--sessions)) 1))
      (magent-store-restart)
      (should (= (magent-store-flush "s-up") 4))
      (should (equal (magent-store-test--content (magent-store-load "s-up"))
                     "kept in Emacs")))))

(ert-deftest magent-store-a-restart-keeps-queueing-and-says-so-once-saved ()
  "Chunks appended while the backend restarts are saved once, in order."
  (magent-store-test--with-backend
    (let ((magent-store--recovering nil)
          (messages nil))
      (magent-store-open "s-again")
      (magent-store-test--start-turn "s-again")
      (magent-store-flush "s-again")
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (signal-process (magent-store--backend-pid magent-store--backend) 'SIGKILL)
        ;; Appending never waits, backend or not.
        (dotimes (i 20)
          (magent-store-append-item-content "s-again" "item-1" (format "<%d>" i))
          (magent-store-request-flush "s-again")
          (sleep-for 0.01))
        (let ((deadline (+ (float-time) 5)))
          (while (and magent-store--recovering (< (float-time) deadline))
            (sleep-for 0.05))))
      (should-not magent-store--recovering)
      (should (cl-some (lambda (m) (string-match-p "restarted; everything it had not saved" m))
                       messages))
      (should (equal (magent-store-test--content (magent-store-load "s-again"))
                     (mapconcat (lambda (i) (format "<%d>" i)) (number-sequence 0 19) ""))))))

(provide 'magent-store-recovery-tests)
;;; magent-store-recovery-tests.el ends here
